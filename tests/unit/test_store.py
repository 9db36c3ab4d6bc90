"""The store on SQLite and a real PostgreSQL: migrations, transactions, status history."""

from __future__ import annotations

from datetime import date

import pytest
from sqlalchemy import inspect
from sqlmodel import select

from kb.domain.errors import StoreError
from kb.models import Cause, CauseStatusChange, Incident
from kb.repo.engine import database_url, redact_url
from kb.repo.migrate import current_revision
from kb.repo.store import Store, add_evidence, record_status_change

TABLES = {
    "incident",
    "symptom",
    "cause",
    "evidence",
    "evidencelink",
    "causestatuschange",
    "decision",
    "reference",
    "familylink",
    "triagerun",
}


def _incident(store: Store, slug: str = "2026-06-10-x") -> int:
    with store.session() as session:
        incident = Incident(slug=slug, title="t", opened_on=date(2026, 6, 10))
        session.add(incident)
        session.flush()
        assert incident.id is not None
        return incident.id


def test_migration_upgrades_empty_database_to_head_and_back(db_url: str) -> None:
    store = Store(db_url, migrate=False)
    try:
        assert current_revision(store.engine) is None
        store.upgrade()
        assert current_revision(store.engine) is not None
        assert TABLES <= set(inspect(store.engine).get_table_names())
        store.downgrade("base")
        assert current_revision(store.engine) is None
        assert not TABLES & set(inspect(store.engine).get_table_names())
        store.upgrade()
        assert TABLES <= set(inspect(store.engine).get_table_names())
    finally:
        store.close()


def test_status_change_always_writes_history(store: Store) -> None:
    incident_id = _incident(store)
    with store.session() as session:
        cause = Cause(
            incident_id=incident_id,
            key="quantized-weights",
            catalogue_id="quantized-weights",
            title="QAT Q4 made it dumber",
            status="suspected",
        )
        record_status_change(session, cause, "suspected", actor="engine", rationale="first guess")
        evidence = add_evidence(
            session,
            incident_id=incident_id,
            kind="measurement",
            summary="A/B seed=42: ties on 4 prompts",
        )
        record_status_change(
            session, cause, "rejected", actor="alice", rationale="A/B", evidence_keys=[evidence.key]
        )
    with store.session(readonly=True) as session:
        rows = session.exec(select(CauseStatusChange).order_by(CauseStatusChange.id)).all()
        assert [(r.from_status, r.to_status) for r in rows] == [
            (None, "suspected"),
            ("suspected", "rejected"),
        ]
        assert rows[1].evidence_keys == ["E1"]
        assert session.exec(select(Cause)).one().status == "rejected"


def test_status_change_refuses_unknown_status_and_missing_evidence(store: Store) -> None:
    incident_id = _incident(store)
    with pytest.raises(StoreError, match="unknown cause status"):
        with store.session() as session:
            cause = Cause(
                incident_id=incident_id, key="c", catalogue_id="token-limit", title="t", status="x"
            )
            record_status_change(session, cause, "maybe", actor="a", rationale="r")
    with pytest.raises(StoreError, match="unknown evidence"):
        with store.session() as session:
            cause = Cause(
                incident_id=incident_id, key="c", catalogue_id="token-limit", title="t", status="x"
            )
            record_status_change(
                session, cause, "suspected", actor="a", rationale="r", evidence_keys=["E9"]
            )
    with store.session(readonly=True) as session:
        assert session.exec(select(Cause)).all() == []
        assert session.exec(select(CauseStatusChange)).all() == []


def test_a_failed_transaction_leaves_nothing_behind(store: Store) -> None:
    with pytest.raises(RuntimeError):
        with store.session() as session:
            session.add(Incident(slug="2026-01-01-a", title="a", opened_on=date(2026, 1, 1)))
            session.flush()
            raise RuntimeError("boom")
    with store.session(readonly=True) as session:
        assert session.exec(select(Incident)).all() == []


def test_foreign_keys_are_enforced(store: Store) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        with store.session() as session:
            session.add(
                Cause(incident_id=999, key="k", catalogue_id="token-limit", title="t", status="x")
            )
            session.flush()


def test_sqlite_pragmas_hold_on_every_pooled_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        connections = [store.engine.raw_connection() for _ in range(3)]
        for conn in connections:
            cursor = conn.cursor()
            assert cursor.execute("PRAGMA foreign_keys").fetchone()[0] == 1
            assert cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert cursor.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
        for conn in connections:
            conn.close()
    finally:
        store.close()


def test_database_url_defaults_to_sqlite_in_data_dir_and_env_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path / "home"))
    assert database_url() == f"sqlite:///{tmp_path / 'home' / 'triage.db'}"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", "postgresql+psycopg://u:secret@h/db")
    assert database_url() == "postgresql+psycopg://u:secret@h/db"
    assert "secret" not in redact_url(database_url())


def test_add_evidence_many_numbers_after_existing_keys_and_validates_first(store: Store) -> None:
    from kb.repo.store import EvidenceItem, add_evidence_many

    incident_id = _incident(store)
    with store.session() as session:
        add_evidence(session, incident_id=incident_id, kind="log", summary="first")
        rows = add_evidence_many(
            session,
            incident_id,
            [EvidenceItem("probe", f"reply {i}") for i in range(3)],
            run_id=None,
        )
        assert [row.key for row in rows] == ["E2", "E3", "E4"]
    with pytest.raises(StoreError, match="unknown evidence kind"):
        with store.session() as session:
            add_evidence_many(
                session,
                incident_id,
                [EvidenceItem("probe", "ok"), EvidenceItem("gossip", "no")],
            )
    with store.session(readonly=True) as session:
        from kb.models import Evidence

        assert len(session.exec(select(Evidence)).all()) == 4
