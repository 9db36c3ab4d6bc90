"""Benchmark (not a timed test): requests the sequential rule needs vs a fixed 30 replays per
arm to reach the same verdicts, and the engine's overhead over the server's own time.

Run with `make bench`; prints a table with the machine it ran on.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from kb.store import Store
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, diagnose
from triage.stackfile import load_stack

pytestmark = [pytest.mark.bench, pytest.mark.integration]

CASES = [
    ("gemma4-thinking-budget", "greedy"),
    ("gemma4-toolcall", "sampled"),
    ("gemma4-thinking-budget", "sampled"),
]


def _verdicts(diagnosis: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in diagnosis["causes"]}


@pytest.mark.parametrize("drill_name,request_name", CASES)
def test_sequential_vs_fixed_requests(tmp_path: Path, drill_name: str, request_name: str) -> None:
    drill = build_drill(drill_name, tmp_path / "drill")
    stack = load_stack(drill.out_dir / "stack.toml")
    results = {}
    for label, options in (
        ("sequential", DiagnoseOptions(max_requests=64, log_dir=tmp_path / "seq")),
        ("fixed-30", DiagnoseOptions(max_requests=30, looks=[30], log_dir=tmp_path / "fixed")),
    ):
        store = Store(f"sqlite:///{tmp_path / (label + '.db')}")
        try:
            results[label] = diagnose(store, stack, drill.request(request_name), options=options)
        finally:
            store.close()
    seq, fixed = results["sequential"], results["fixed-30"]
    seq_requests = sum(a["n"] for a in seq["arms"])
    fixed_requests = sum(a["n"] for a in fixed["arms"])
    cost = seq["cost"]
    slots = _concurrency(seq)
    # The definition: wall / (server time summed from `timings` + launch time). With
    # several slots in flight the summed server time can exceed the wall time, so the stricter
    # per-slot form (server time / slots) is printed too.
    overhead = cost["wall_seconds"] / max(cost["server_seconds"] + cost["launch_seconds"], 1e-9)
    per_slot = cost["wall_seconds"] / max(
        cost["server_seconds"] / slots + cost["launch_seconds"], 1e-9
    )
    differ = {
        k: (v, _verdicts(fixed)[k]) for k, v in _verdicts(seq).items() if v != _verdicts(fixed)[k]
    }
    print(
        f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    print(
        "| drill / request | sequential requests | fixed-30 requests | ratio | "
        "verdicts differ | wall s | server s (sum) | launch s | overhead | per-slot |"
    )
    print(
        f"| {drill_name} / {request_name} | {seq_requests} | {fixed_requests} | "
        f"{seq_requests / fixed_requests:.2f} | {differ or 'none'} | {cost['wall_seconds']} | "
        f"{cost['server_seconds']:.1f} | {cost['launch_seconds']} | {overhead:.2f} | "
        f"{per_slot:.2f} |"
    )


def _concurrency(diagnosis: dict) -> int:
    for obs in diagnosis.get("observations", []):
        if obs.get("name") == "server-props" and obs.get("total_slots"):
            return min(int(obs["total_slots"]), 4)
    return 1
