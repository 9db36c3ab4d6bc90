"""Benchmark: how long a large `triage import` keeps other writers waiting (issue 27, item 7:
an import of incident files committed everything in one transaction).

Runs `triage import` of 2,000 incident files in a subprocess and meanwhile, every 50 ms,
measures how long a writer waits for the write lock (BEGIN IMMEDIATE; ROLLBACK) and how long
a reader's query takes; once with the default batches and once with `--batch 100000` (one
transaction, as before). Not a timed test: it prints the numbers and asserts only that every
incident was stored once and the reader never failed. Run with
`pytest -m bench -s tests/bench/test_bench_import_lock.py`.
"""

from __future__ import annotations

import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kb.repo.store import Store

pytestmark = pytest.mark.bench

INCIDENTS = 2_000


def _files(folder: Path) -> Path:
    folder.mkdir()
    for n in range(INCIDENTS):
        slug = f"2026-07-01-bench-{n:05d}"
        evidence = "".join(
            f"  - id: E{k}\n    kind: log\n    summary: log line {n}.{k}\n"
            "    recorded_at: 2026-07-01T10:00:00Z\n"
            for k in range(1, 6)
        )
        (folder / f"{slug}.md").write_text(
            f"---\nslug: {slug}\ntitle: Bench incident {n}\nstatus: open\n"
            f"opened: 2026-07-01\nevidence:\n{evidence}---\nNarrative {n}.\n",
            encoding="utf-8",
        )
    return folder


@pytest.mark.parametrize("batch", ["200", "100000"], ids=["batched", "one-transaction"])
def test_bench_import_holds_the_write_lock_one_batch_at_a_time(tmp_path: Path, batch: str) -> None:
    db = tmp_path / "kb.db"
    Store(f"sqlite:///{db}").close()
    folder = _files(tmp_path / "incidents")
    argv = [str(Path(sys.executable).parent / "triage"), "--database", f"sqlite:///{db}"]
    started = time.monotonic()
    job = subprocess.Popen(
        [*argv, "import", "--batch", batch, str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    waits: list[float] = []
    reads: list[float] = []
    conn = sqlite3.connect(db, timeout=600, isolation_level=None)
    try:
        while job.poll() is None:
            began = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            waits.append(time.monotonic() - began)
            began = time.monotonic()
            conn.execute("SELECT count(*) FROM incident").fetchone()
            reads.append(time.monotonic() - began)
            time.sleep(0.05)
        stored = conn.execute("SELECT count(DISTINCT slug) FROM incident").fetchone()[0]
    finally:
        conn.close()
        if job.poll() is None:
            job.kill()
        job.wait(timeout=60)
    wall = time.monotonic() - started
    assert job.returncode == 0
    assert stored == INCIDENTS
    assert waits
    print(
        f"\nimport of {INCIDENTS} incident files, --batch {batch}: {wall:.1f} s wall; "
        f"write-lock wait over {len(waits)} samples: median "
        f"{statistics.median(waits) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms; "
        f"reader query max {max(reads) * 1000:.1f} ms"
    )
