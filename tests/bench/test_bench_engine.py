"""Benchmark (not a timed test): requests the sequential rule needs vs a fixed 30 replays per
arm to reach the same verdicts, and the engine's overhead over the server's own time.

Per-slot overhead = wall seconds of the whole diagnosis / (the server's own seconds summed
over every reply, `timings.prompt_ms + predicted_ms`, divided by the slots it serves at once,
plus the launch seconds of every server). 1.0 would be a server busy on all its slots from
launch to the last reply with no time outside its timings. The floor column is the same ratio
for a bare client (httpx, no capture, scoring or store) sending as many replays of the
baseline's request to the incident's server at the same slots, measured right after the
diagnosis: llama-server's own time outside `timings` (HTTP, chat template, tokenizing, the
JSON answer) counts against both. "engine / floor" is what the engine adds. Engine CPU is
the diagnosing process's CPU seconds per reply (robust to other load on the machine).

Run with `make bench`; prints a table with the machine it ran on.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kb.repo.store import Store
from triage import probes
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.engine.servers import open_server
from triage.stackfile import Stack, load_stack

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
    cpu = {}
    for label, options in (
        ("sequential", DiagnoseOptions(max_requests=64, log_dir=tmp_path / "seq")),
        ("fixed-30", DiagnoseOptions(max_requests=30, looks=[30], log_dir=tmp_path / "fixed")),
    ):
        store = Store(f"sqlite:///{tmp_path / (label + '.db')}")
        started = time.process_time()
        try:
            results[label] = diagnose(
                store, Intake(drill.request(request_name)), stack, options=options
            ).to_json()
        finally:
            cpu[label] = time.process_time() - started
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
    floor = _bare_client_ratio(stack, drill.request(request_name), seq_requests, slots, tmp_path)
    differ = {
        k: (v, _verdicts(fixed)[k]) for k, v in _verdicts(seq).items() if v != _verdicts(fixed)[k]
    }
    print(
        f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    print(
        "| drill / request | sequential requests | fixed-30 requests | ratio | "
        "verdicts differ | wall s | server s (sum) | launch s | overhead | per-slot | "
        "floor (bare client) | engine / floor | engine CPU ms/reply |"
    )
    print(
        f"| {drill_name} / {request_name} | {seq_requests} | {fixed_requests} | "
        f"{seq_requests / fixed_requests:.2f} | {differ or 'none'} | {cost['wall_seconds']} | "
        f"{cost['server_seconds']:.1f} | {cost['launch_seconds']} | {overhead:.2f} | "
        f"{per_slot:.2f} | {floor:.2f} | {per_slot / floor:.2f} | "
        f"{1000 * cpu['sequential'] / max(cost['requests'], 1):.1f} |"
    )
    assert not differ, f"the sequential rule changed verdicts: {differ}"


def _concurrency(diagnosis: dict) -> int:
    for obs in diagnosis.get("observations", []):
        if obs.get("name") == "server-props" and obs.get("total_slots"):
            return min(int(obs["total_slots"]), 4)
    return 1


def _bare_client_ratio(
    stack: Stack, request: dict[str, Any], n: int, slots: int, tmp_path: Path
) -> float:
    """The per-slot ratio of a bare httpx client: `n` replays of `request` (seeds varied as
    the engine varies them) on the incident's server, `slots` in flight."""
    with open_server(stack.server, tmp_path / "floor", 60.0) as server:

        async def send_all() -> tuple[float, float]:
            gate = asyncio.Semaphore(slots)
            async with httpx.AsyncClient(
                base_url=server.base_url, timeout=180.0, trust_env=False
            ) as client:

                async def one(index: int) -> float:
                    async with gate:
                        reply = await client.post(
                            "/v1/chat/completions", json=probes.replay_body(request, 1000 + index)
                        )
                    timings = reply.json().get("timings") or {}
                    return float(timings.get("prompt_ms", 0) + timings.get("predicted_ms", 0))

                started = time.monotonic()
                server_ms = await asyncio.gather(*[one(i) for i in range(n)])
                return time.monotonic() - started, sum(server_ms) / 1000.0

        wall, server_seconds = asyncio.run(send_all())
    return wall / max(server_seconds / slots, 1e-9)
