"""The knowledge-base service (kb.service): what the CLI, the UI and the proxy see through it.

Each test runs on SQLite and on PostgreSQL (the `db_url` fixture).
"""

from __future__ import annotations

import socket
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from kb.models import Cause
from kb.repo.store import (
    add_evidence,
    exchange_content_hash,
    open_incident,
    record_status_change,
)
from kb.service import (
    ConflictError,
    DatabaseError,
    DecisionRequest,
    IncidentFilters,
    KnowledgeBase,
    NotFoundError,
    OpenError,
    StoreError,
)
from kb.service.captures import CapturedExchange, attach_orphans, orphans, store_captures
from kb.service.live import LiveBatch, LiveRow, record_live

OPENED = date(2026, 7, 1)


def _incident(kb: KnowledgeBase, title: str, *, cause_status: str = "suspected") -> str:
    """An open incident with one cause (quantized-weights) and one piece of evidence (E1)."""
    with kb.transaction() as session:
        incident = open_incident(session, title, model="gemma", opened_on=OPENED)
        add_evidence(session, incident_id=incident.id, kind="measurement", summary="A/B 3/4")
        assert incident.id is not None
        cause = Cause(
            incident_id=incident.id,
            key="quantized-weights",
            catalogue_id="quantized-weights",
            title="Quantized weights",
            status=cause_status,
        )
        record_status_change(
            session, cause, cause_status, actor="engine", rationale="first measurement"
        )
        return incident.slug


@pytest.fixture
def kb(db_url: str) -> KnowledgeBase:
    handle = KnowledgeBase.open(db_url)
    yield handle  # type: ignore[misc]
    handle.close()


def test_a_parked_decision_shows_in_the_incident_list_and_the_decision_log(
    kb: KnowledgeBase,
) -> None:
    parked = _incident(kb, "Empty replies under speculative decoding")
    other = _incident(kb, "Garbled tool calls")
    recorded = kb.record_decision(
        parked,
        DecisionRequest(
            kind="PARKED", by="dana", rationale="Drill only.", revisit_on=date(2099, 1, 1)
        ),
    )
    assert recorded.incident_status == "parked"

    page = kb.list_incidents(IncidentFilters())
    rows = {row.slug: row for row in page.rows}
    assert page.total == 2
    assert rows[parked].status == "parked"
    assert rows[parked].decision == "PARKED"
    assert rows[parked].revisit_on == date(2099, 1, 1)
    assert rows[other].decision == ""
    # The decision filter narrows the list the same way.
    only_parked = kb.list_incidents(IncidentFilters(decision="PARKED"))
    assert [row.slug for row in only_parked.rows] == [parked]
    undecided = kb.list_incidents(IncidentFilters(decision="none"))
    assert [row.slug for row in undecided.rows] == [other]

    [entry] = kb.decisions()
    assert (entry.slug, entry.kind, entry.by, entry.incident_status) == (
        parked,
        "PARKED",
        "dana",
        "parked",
    )
    [due] = kb.parked(date(2099, 1, 2))
    assert due.slug == parked and due.due
    assert kb.parked_incident(other, date(2099, 1, 2)) is None


def test_a_decision_kb_refuses_says_why_and_changes_nothing(kb: KnowledgeBase) -> None:
    slug = _incident(kb, "Empty replies")
    with pytest.raises(StoreError, match="PARKED needs .*a way back"):
        kb.record_decision(slug, DecisionRequest(kind="PARKED", by="dana", rationale="later"))
    with pytest.raises(StoreError, match="unknown decision 'SHELVED'"):
        kb.record_decision(slug, DecisionRequest(kind="SHELVED", by="dana", rationale="x"))
    assert kb.decisions() == []
    assert kb.list_incidents(IncidentFilters()).rows[0].status == "open"


def test_a_bad_incident_id_is_a_clear_error(kb: KnowledgeBase) -> None:
    _incident(kb, "Empty replies")
    assert kb.incident_record("2026-07-01-no-such-incident") is None
    with pytest.raises(NotFoundError, match="no incident with slug '2026-07-01-nope'"):
        kb.require_record("2026-07-01-nope")
    with pytest.raises(StoreError, match="no incident with slug '2026-07-01-nope'"):
        kb.record_decision(
            "2026-07-01-nope", DecisionRequest(kind="REOPENED", by="dana", rationale="back")
        )
    with pytest.raises(NotFoundError, match="no incident with slug '2026-07-01-nope'"):
        kb.change_cause_status(
            "2026-07-01-nope", "quantized-weights", "rejected", actor="al", rationale="no"
        )


def test_a_status_override_lands_in_the_cause_history(kb: KnowledgeBase) -> None:
    slug = _incident(kb, "Empty replies", cause_status="confirmed")
    change = kb.change_cause_status(
        slug,
        "quantized-weights",
        "suspected",
        actor="alice",
        rationale="  The A/B used 4 prompts only.  ",
        evidence_keys=["E1"],
    )
    assert (change.from_status, change.to_status, change.actor) == (
        "confirmed",
        "suspected",
        "alice",
    )
    assert change.rationale == "The A/B used 4 prompts only."
    record = kb.require_record(slug)
    [cause] = record["causes"]
    assert cause["status"] == "suspected"
    assert [h["actor"] for h in cause["history"]][-1] == "alice"
    assert kb.list_incidents(IncidentFilters(cause_status="confirmed")).rows == []


def test_a_status_override_the_store_refuses_names_the_problem(kb: KnowledgeBase) -> None:
    slug = _incident(kb, "Empty replies")
    with pytest.raises(NotFoundError, match="no cause 'speculative-decoding'"):
        kb.change_cause_status(slug, "speculative-decoding", "rejected", actor="a", rationale="b")
    with pytest.raises(StoreError, match="is already suspected"):
        kb.change_cause_status(slug, "quantized-weights", "suspected", actor="a", rationale="b")
    with pytest.raises(StoreError, match="unknown cause status 'dismissed'"):
        kb.change_cause_status(slug, "quantized-weights", "dismissed", actor="a", rationale="b")
    with pytest.raises(StoreError, match="needs an actor"):
        kb.change_cause_status(slug, "quantized-weights", "rejected", actor=" ", rationale="b")
    with pytest.raises(StoreError, match=r"unknown evidence id\(s\) \['E9'\]"):
        kb.change_cause_status(
            slug, "quantized-weights", "rejected", actor="a", rationale="b", evidence_keys=["E9"]
        )
    [cause] = kb.require_record(slug)["causes"]
    assert cause["status"] == "suspected"  # nothing was written


def test_search_and_recent_incidents(kb: KnowledgeBase) -> None:
    first = _incident(kb, "Empty replies under speculative decoding")
    second = _incident(kb, "Garbled tool calls")
    assert [item.slug for item in kb.recent_incidents(limit=1)] == [second]
    found = kb.list_incidents(IncidentFilters(query="garbled"))
    assert found.searched
    assert [row.slug for row in found.rows] == [second]
    assert "Garbled" in found.rows[0].match
    assert first not in {row.slug for row in found.rows}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    url = f"postgresql+psycopg://triage:s3cret-pw@127.0.0.1:{_closed_port()}/kb"
    with pytest.raises(OpenError) as info:
        KnowledgeBase.open(url)
    message = str(info.value)
    assert message.startswith("postgresql+psycopg://triage:***@127.0.0.1:")
    assert "s3cret-pw" not in message and "\n" not in message
    assert isinstance(info.value, StoreError)


def test_a_write_to_a_read_only_knowledge_base_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    with KnowledgeBase.open(url) as writable:
        slug = _incident(writable, "Empty replies")
    with KnowledgeBase.open(url, readonly=True) as readonly:
        assert readonly.list_incidents(IncidentFilters()).total == 1
        with pytest.raises(DatabaseError, match="is open read-only; this command writes") as info:
            readonly.change_cause_status(
                slug, "quantized-weights", "rejected", actor="al", rationale="no"
            )
        assert "INSERT" not in str(info.value) and "UPDATE" not in str(info.value)


def _live_row(key: str, at: datetime) -> LiveRow:
    return {
        "key": key,
        "recorded_at": at,
        "replica": "proxy-a",
        "path": "/v1/chat/completions",
        "model": "gemma",
        "client": "",
        "signature": "",
        "failed": False,
        "status": 200,
        "elapsed_ms": 12.0,
        "stream": False,
        "upstream_build": "b9589",
        "template_sha256": "ab" * 32,
        "findings": [],
        "body": None,
        "body_truncated": False,
        "shape": "chat",
        "client_limit": "",
    }


def test_a_live_batch_a_replica_raced_is_retried_and_stored_once(kb: KnowledgeBase) -> None:
    at = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
    attempts: list[int] = []

    def write(batch: LiveBatch) -> set[str]:
        inserted = batch.insert_exchanges([_live_row("k-1", at)])
        attempts.append(len(inserted))
        if len(attempts) == 1:  # as if another replica took a unique key first
            raise ConflictError("duplicate key", url=kb.url, detail="UniqueViolation")
        return inserted

    assert record_live(kb, write) == {"k-1"}
    assert attempts == [1, 1]  # the first attempt was rolled back, not kept
    overview = kb.live_overview(
        at - timedelta(hours=1), at + timedelta(hours=1), timedelta(hours=1)
    )
    assert overview.upstream is not None and overview.upstream.build == "b9589"
    assert record_live(kb, lambda batch: batch.insert_exchanges([_live_row("k-1", at)])) == set()


def test_a_live_batch_that_keeps_conflicting_gives_up_with_the_conflict(kb: KnowledgeBase) -> None:
    calls: list[int] = []

    def write(_batch: LiveBatch) -> None:
        calls.append(1)
        raise ConflictError("duplicate key", url=kb.url, detail="UniqueViolation")

    with pytest.raises(ConflictError):
        record_live(kb, write)
    assert len(calls) == 3


def _captured(text: str) -> CapturedExchange:
    exchange = {"request": {"messages": [{"role": "user", "content": text}]}, "status": 200}
    return CapturedExchange(
        exchange=exchange,
        findings=[],
        symptoms=[],
        digest=exchange_content_hash(exchange),
        summary=f"captured exchange {text}",
        source="jsonl:capture.jsonl",
    )


def test_a_capture_stored_twice_is_stored_once_and_attached_later(kb: KnowledgeBase) -> None:
    items = [_captured("one"), _captured("two"), _captured("one")]
    first = store_captures(kb, items, None, batch=2)
    assert first.duplicates == {2} and first.keys[2] == first.keys[0]
    again = store_captures(kb, items, None, batch=2)
    assert again.duplicates == {0, 1, 2} and again.keys == first.keys
    assert [o.summary for o in orphans(kb)] == ["captured exchange one", "captured exchange two"]

    slug = _incident(kb, "Empty replies")  # holds E1 already
    attached = attach_orphans(kb, ["all"], slug)
    assert [(a.key, a.duplicate) for a in attached] == [("E2", False), ("E3", False)]
    assert orphans(kb) == []
    assert {e["id"] for e in kb.require_record(slug)["evidence"]} == {"E1", "E2", "E3"}


def test_capturing_onto_or_attaching_to_a_bad_incident_names_it(kb: KnowledgeBase) -> None:
    with pytest.raises(NotFoundError, match="no incident with slug '2026-07-01-nope'"):
        store_captures(kb, [_captured("one")], "2026-07-01-nope", batch=10)
    assert orphans(kb) == []  # nothing was stored
    store_captures(kb, [_captured("one")], None, batch=10)
    [orphan] = orphans(kb)
    with pytest.raises(NotFoundError, match="no incident with slug '2026-07-01-nope'"):
        attach_orphans(kb, [orphan.key], "2026-07-01-nope")
    with pytest.raises(StoreError, match="E99"):
        attach_orphans(kb, ["E99"], _incident(kb, "Empty replies"))
    assert [o.key for o in orphans(kb)] == [orphan.key]
