"""Benchmark: start-up of `triage --help`, lazy command loading vs every command up front.

Not a timed test: each variant runs as its own process RUNS times (after one warm-up) and
the median wall and CPU seconds (the child's own user + system time) are printed with the
machine. "eager" is the group as it was before it loaded commands lazily: every command
module imported first (the proxy's uvicorn, the engine's scipy, SQLAlchemy, ...), then
`--help`. Both must print the same help. Run with
`pytest -m bench -s tests/bench/test_bench_cli_startup.py`.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.bench

RUNS = int(os.environ.get("TRIAGE_BENCH_CLI_RUNS", "10"))
LAZY = "from triage.cli import cli; cli(prog_name='triage')"
EAGER = (
    "from triage.cli import COMMANDS, cli, load_commands\n"
    "for module in sorted({entry.module for entry in COMMANDS.values()}):\n"
    "    for name, command in load_commands(module).items():\n"
    "        cli.add_command(command, name)\n"
    "cli(prog_name='triage')\n"
)


def _run(code: str) -> tuple[float, float, str]:
    """One `triage --help` process: (wall s, CPU s, what it printed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def test_bench_triage_help_startup() -> None:
    rows = {}
    outputs = {}
    for label, code in (("lazy", LAZY), ("eager", EAGER)):
        _run(code)  # warm-up: the page cache and the .pyc files
        runs = [_run(code) for _ in range(RUNS)]
        rows[label] = (
            statistics.median(run[0] for run in runs),
            statistics.median(run[1] for run in runs),
        )
        outputs[label] = {run[2] for run in runs}
    # The same help either way (and always the same).
    assert len(outputs["lazy"]) == 1
    assert outputs["lazy"] == outputs["eager"]
    assert "Commands:" in next(iter(outputs["lazy"]))
    print(
        f"\n`triage --help` start-up, median of {RUNS} runs; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| variant | wall s | CPU s |")
    print("|---|---|---|")
    for label, (wall, cpu) in rows.items():
        print(f"| {label} | {wall:.3f} | {cpu:.3f} |")
    print(f"eager / lazy CPU: {rows['eager'][1] / rows['lazy'][1]:.1f}x")
