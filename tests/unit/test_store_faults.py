"""Store faults (issue 27): processes racing to create a fresh knowledge base, evidence
deduplication on re-diagnosis, batched captures beside a reader, read-only knowledge bases."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from kb_openers import open_fresh
from sqlalchemy import inspect, text
from sqlmodel import select

from kb import runs
from kb.migrate import head_revision
from kb.models import Evidence
from kb.store import Store, require_incident
from triage.capture import load_file
from triage.cli import cli
from triage.engine.recorder import Recorder
from triage.symptoms import classify

OPENERS = 6


def test_processes_opening_a_fresh_kb_at_once_all_succeed(db_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(OPENERS)
    results = context.Queue()
    processes = [
        context.Process(target=open_fresh, args=(db_url, ready, results)) for _ in range(OPENERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert outcomes == ["ok"] * OPENERS, outcomes
    assert [process.exitcode for process in processes] == [0] * OPENERS
    store = Store(db_url, migrate=False)
    try:
        with store.engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            tables = set(inspect(conn).get_table_names())
    finally:
        store.close()
    assert [row[0] for row in versions] == [head_revision()]
    assert {"incident", "evidence", "cause"} <= tables


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _exchange_rows(store: Store, slug: str) -> list[str]:
    with store.session(readonly=True) as session:
        incident = require_incident(session, slug)
        rows = session.exec(
            select(Evidence.key).where(
                Evidence.incident_id == incident.id, Evidence.kind == "exchange"
            )
        ).all()
    return sorted(rows)


def _prepare(store: Store, slug: str | None, exchange: dict[str, Any], findings: Any) -> Recorder:
    recorder = Recorder(store, actor="test")
    recorder.prepare(
        slug,
        runs.NewIncident(model="m", kinds=["tool-args-invalid-json"]),
        [],
        exchange=exchange,
        findings=findings,
        plan={"request": exchange.get("request")},
    )
    return recorder


def test_rediagnosing_an_incident_does_not_store_its_exchange_again(
    store: Store, tmp_path: Path
) -> None:
    (loaded,) = load_file(FIXTURES / "tool-args-invalid-json.json")
    exchange = loaded.to_dict()
    findings = [f.to_dict() for f in classify(loaded)]
    first = _prepare(store, None, exchange, findings)
    slug = first.incident_slug
    again = [_prepare(store, slug, exchange, findings) for _ in range(2)]
    assert _exchange_rows(store, slug) == ["E1"]
    assert [r.evidence_keys["exchange"] for r in (first, *again)] == ["E1"] * 3
    # A capture of the same file before a diagnosis is the same evidence too.
    result = CliRunner().invoke(
        cli,
        [
            "--database",
            store.url,
            "capture",
            "--incident",
            slug,
            str(FIXTURES / "tool-args-invalid-json.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "already stored" in result.output
    assert _exchange_rows(store, slug) == ["E1"]
    # A different exchange is still stored.
    changed = {**exchange, "status": 599}
    other = _prepare(store, slug, changed, findings)
    assert other.evidence_keys["exchange"] == "E2"
    assert _exchange_rows(store, slug) == ["E1", "E2"]
