"""Benchmark: storing a HAR-sized capture as evidence, 2,500 vs 10,000 exchanges.

Issue 18 measured 128 s for 10,000 entries vs 12 s for 2,500 (numbering each row rescanned
every key). Storage should be linear: the time per entry at 10,000 within 2x of the time
per entry at 2,500. Not a timed test: it prints the table with the machine and asserts only
that every row was stored with a distinct key. Run with `make bench`.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from kb.models import Evidence
from kb.repo.store import EvidenceItem, Store, add_evidence, add_evidence_many

pytestmark = pytest.mark.bench

SIZES = (2_500, 10_000)
TARGET_RATIO = 2.0


def _payload(number: int) -> dict[str, Any]:
    text = f"reply {number} " + "lorem ipsum dolor sit amet " * 40
    return {
        "exchange": {
            "request": {
                "model": "gemma-4",
                "max_tokens": 800,
                "messages": [{"role": "user", "content": f"task {number}"}],
            },
            "response": {
                "status": 200,
                "body": {"choices": [{"finish_reason": "stop", "message": {"content": text}}]},
            },
        },
        "findings": [{"kind": "empty-content", "passed": True, "score": 0.0, "reason": "ok"}],
        "symptoms": [],
    }


def _store_rows(store: Store, count: int, batch: bool) -> float:
    """Seconds to store `count` captured exchanges in one transaction (as `triage capture`)."""
    started = time.perf_counter()
    with store.session() as session:
        if batch:
            add_evidence_many(
                session,
                None,
                [
                    EvidenceItem(
                        kind="exchange",
                        summary=f"captured har exchange #{n}",
                        payload=_payload(n),
                        source=f"har:capture.har:entries[{n}]",
                    )
                    for n in range(count)
                ],
            )
        else:
            for n in range(count):
                add_evidence(
                    session,
                    incident_id=None,
                    kind="exchange",
                    summary=f"captured har exchange #{n}",
                    payload=_payload(n),
                    source=f"har:capture.har:entries[{n}]",
                )
    return time.perf_counter() - started


@pytest.mark.parametrize("batch", [False, True], ids=["per-row", "batch"])
def test_capture_storage_is_linear(db_url: str, batch: bool) -> None:
    rows = []
    for size in SIZES:
        store = Store(db_url)
        try:
            with store.session() as session:  # each size starts from an empty table
                for row in session.exec(select(Evidence)).all():
                    session.delete(row)
            seconds = _store_rows(store, size, batch)
            with store.session(readonly=True) as session:
                keys = session.exec(select(Evidence.key)).all()
                total = session.exec(select(func.count()).select_from(Evidence)).one()
        finally:
            store.close()
        assert total == size and len(set(keys)) == size
        rows.append((size, seconds))
    per_entry = [seconds / size * 1000 for size, seconds in rows]
    ratio = per_entry[1] / per_entry[0]
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    dialect = db_url.split(":", 1)[0]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    how = "add_evidence_many" if batch else "add_evidence per row"
    lines = [f"\ncapture storage ({dialect}, {how}):"]
    lines += [
        f"  {size:>6,} exchanges: {seconds:7.2f} s, {ms:.3f} ms/entry"
        for (size, seconds), ms in zip(rows, per_entry, strict=True)
    ]
    lines.append(f"  ratio 10k/2.5k per entry: {ratio:.2f} (target <= {TARGET_RATIO}: {verdict})")
    lines.append(
        f"  machine: {platform.platform()}; {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}; load average {load}"
    )
    print("\n".join(lines))
