"""Benchmark: how long a large `triage capture` keeps others waiting (issue 27, item 7: a
10,000-exchange capture held SQLite's write lock for 672 s in one transaction and a
`triage ui` started meanwhile exited "database is locked").

Runs `triage capture` of 10,000 JSONL exchanges in a subprocess and meanwhile, every 50 ms,
measures how long a writer waits for the write lock (BEGIN IMMEDIATE; ROLLBACK) and how
long a reader's query takes. Not a timed test: it prints the numbers and asserts only that
every exchange was stored once and the reader never failed. Run with
`pytest -m bench -s tests/bench/test_bench_capture_lock.py`.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kb.repo.store import Store

pytestmark = pytest.mark.bench

EXCHANGES = 10_000
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "exchanges.jsonl"


def _source(path: Path) -> Path:
    line = FIXTURE.read_text(encoding="utf-8").splitlines()[0]
    with path.open("w", encoding="utf-8") as out:
        for number in range(EXCHANGES):
            record = json.loads(line)
            record["request"]["messages"][-1]["content"] = f"question {number}: the weather?"
            out.write(json.dumps(record) + "\n")
    return path


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_bench_capture_holds_the_write_lock_one_batch_at_a_time(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    Store(f"sqlite:///{db}").close()
    source = _source(tmp_path / "many.jsonl")
    argv = [str(Path(sys.executable).parent / "triage"), "--database", f"sqlite:///{db}"]
    started = time.monotonic()
    capture = subprocess.Popen(
        [*argv, "capture", str(source)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    waits: list[float] = []
    reads: list[float] = []
    conn = sqlite3.connect(db, timeout=600, isolation_level=None)
    try:
        while capture.poll() is None:
            began = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            waits.append(time.monotonic() - began)
            began = time.monotonic()
            conn.execute("SELECT count(*) FROM incident").fetchone()
            reads.append(time.monotonic() - began)
            time.sleep(0.05)
        stored = conn.execute("SELECT count(*) FROM evidence").fetchone()[0]
    finally:
        conn.close()
        if capture.poll() is None:
            capture.kill()
        capture.wait(timeout=60)
    wall = time.monotonic() - started
    assert capture.returncode == 0
    assert stored == EXCHANGES
    print(
        f"\ncapture of {EXCHANGES} exchanges: {wall:.1f} s wall; write-lock wait over "
        f"{len(waits)} samples: median {statistics.median(waits) * 1000:.0f} ms, p95 "
        f"{_quantile(waits, 0.95) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms; reader "
        f"query max {max(reads) * 1000:.1f} ms"
    )
