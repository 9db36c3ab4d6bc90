"""Decisions and the parked list, on SQLite and a real PostgreSQL."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from kb.domain.triggers import DecisionError, build_number, capture_failed
from kb.models import Decision, Incident
from kb.repo.decisions import check_fix, failing_requests, parked, parse_trigger, record_decision
from kb.repo.files import import_paths
from kb.repo.store import Store, add_evidence, get_incident, require_incident

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"
SLUG = "2026-07-01-drill-empty-content"
T0 = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)


def _incident(store: Store, *, server_build: str = "b11434", stack: dict | None = None) -> int:
    with store.session() as session:
        incident = Incident(
            slug=SLUG,
            title="drill: empty content",
            opened_on=T0.date(),
            server_build=server_build,
            stack=stack or {},
        )
        session.add(incident)
        session.flush()
        assert incident.id is not None
        return incident.id


def _arm(
    store: Store, incident_id: int, arm: str, failures: int, n: int, at: datetime, **extra: Any
) -> str:
    with store.session() as session:
        return add_evidence(
            session,
            incident_id=incident_id,
            kind="measurement",
            summary=f"arm {arm}: {failures}/{n}",
            payload={"type": "arm", "arm": arm, "n": n, "failures": failures, **extra},
            recorded_at=at,
        ).key


def _evidence(store: Store, incident_id: int | None, at: datetime, **payload: Any) -> str:
    with store.session() as session:
        return add_evidence(
            session,
            incident_id=incident_id,
            kind=str(payload.pop("kind", "observation")),
            summary="observed",
            payload=payload,
            recorded_at=at,
        ).key


def _status(store: Store) -> str:
    with store.session(readonly=True) as session:
        return require_incident(session, SLUG).status


def _decide(store: Store, kind: str, **kwargs: Any) -> Decision:
    kwargs.setdefault("at", T0 + timedelta(days=1))
    with store.session() as session:
        return record_decision(session, SLUG, kind, **kwargs)


# --------------------------------------------------------------------------- triggers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("new-build", {"kind": "new-build"}),
        ("build>b9586", {"kind": "new-build", "after": 9586}),
        ("new-weights!=ABC123", {"kind": "new-weights", "hash": "abc123"}),
        ("failure-rate>20%", {"kind": "failure-rate", "threshold": 0.2}),
        ("failure-rate>0.3,min=10", {"kind": "failure-rate", "threshold": 0.3, "min_captures": 10}),
        ("failure-rate", {"kind": "failure-rate"}),
        ("date=2026-12-01", {"kind": "date", "on": "2026-12-01"}),
    ],
)
def test_parse_trigger(text: str, expected: dict[str, Any]) -> None:
    assert parse_trigger(text) == expected


@pytest.mark.parametrize("text", ["soon", "failure-rate>1.5", "date=2026-13-01", "build>x"])
def test_parse_trigger_refuses_with_the_syntax(text: str) -> None:
    with pytest.raises(DecisionError) as error:
        parse_trigger(text)
    message = str(error.value)
    assert (
        "expected one of" in message
        or "threshold between 0 and 1" in message
        or ("is not a" in message)
    )


def test_build_numbers_and_capture_verdicts() -> None:
    assert build_number("b11434-0a1b2c3") == 11434
    assert build_number(9586) == 9586
    assert build_number("9586") == 9586
    assert build_number("not a build") is None
    assert build_number(True) is None
    assert capture_failed({"findings": [{"kind": "empty-content", "passed": False}]}) is True
    assert capture_failed({"findings": [{"kind": "empty-content", "passed": True}]}) is False
    assert capture_failed({"failed": False, "findings": [{"passed": False}]}) is False
    assert capture_failed({"exchange": {}}) is None


# --------------------------------------------------------------------------- PARKED


def test_parked_needs_a_rationale_and_a_way_back(store: Store) -> None:
    _incident(store)
    with pytest.raises(DecisionError, match="rationale"):
        _decide(store, "PARKED", revisit_on=date(2026, 9, 1))
    with pytest.raises(DecisionError, match="way back"):
        _decide(store, "PARKED", rationale="non-core")
    with pytest.raises(DecisionError, match="before the decision"):
        _decide(store, "PARKED", rationale="non-core", revisit_on=date(2026, 6, 1))
    assert _status(store) == "open"

    decision = _decide(store, "PARKED", rationale="non-core", triggers=["new-build"])
    assert decision.kind == "PARKED" and decision.revisit_on is None
    # "new" is pinned to what was known when parking, so the trigger reads on its own.
    assert decision.revisit_triggers == [{"kind": "new-build", "after": 11434}]
    assert _status(store) == "parked"


def test_parked_refuses_unknown_evidence_and_incident(store: Store) -> None:
    _incident(store)
    with pytest.raises(DecisionError, match="E99"):
        _decide(store, "PARKED", rationale="r", revisit_on=date(2026, 9, 1), evidence_keys=["E99"])
    with pytest.raises(DecisionError, match="no incident"):
        with store.session() as session:
            record_decision(session, "2026-01-01-nope", "PARKED", rationale="r")
    with store.session(readonly=True) as session:
        assert session.exec(select(Decision)).all() == []


# --------------------------------------------------------------------------- FIXED


def test_fixed_without_evidence_is_refused_with_what_is_missing(store: Store) -> None:
    _incident(store)
    _decide(store, "PARKED", rationale="non-core", revisit_on=date(2026, 9, 1))
    with pytest.raises(DecisionError) as error:
        _decide(store, "FIXED", fix="--reasoning off on the server")
    message = str(error.value)
    assert "refusing FIXED" in message
    assert "no probe run on the current stack" in message
    assert "no measured baseline" in message
    assert "--force" in message
    assert _status(store) == "parked"
    with pytest.raises(DecisionError, match="--fix"):
        _decide(store, "FIXED")


def test_fixed_needs_a_significant_drop_below_the_baseline(store: Store) -> None:
    incident_id = _incident(store)
    baseline = _arm(store, incident_id, "baseline", 4, 8, T0)
    _decide(store, "PARKED", rationale="non-core", revisit_on=date(2026, 9, 1))
    weak = _arm(store, incident_id, "revisit", 2, 8, T0 + timedelta(days=2))
    with pytest.raises(DecisionError) as error:
        _decide(store, "FIXED", fix="x", at=T0 + timedelta(days=3))
    assert f"2/8 (25%) [{weak}]" in str(error.value)
    assert f"baseline 4/8 (50%) [{baseline}]" in str(error.value)
    assert "not significantly below" in str(error.value)

    strong = _arm(store, incident_id, "revisit", 0, 16, T0 + timedelta(days=4))
    with store.session(readonly=True) as session:
        check = check_fix(session, require_incident(session, SLUG))
    assert check.verified and check.run is not None and check.run.evidence_keys == (strong,)
    assert check.p_value is not None and check.p_value < 0.05

    decision = _decide(store, "FIXED", fix="--reasoning off", at=T0 + timedelta(days=5))
    assert decision.verified is True
    assert decision.evidence_keys == [baseline, strong]
    assert decision.rationale.startswith("Verified: failure rate 0/16 (0%)")
    assert _status(store) == "fixed"


def test_a_named_run_must_be_an_arm_and_baseline_must_have_failed(store: Store) -> None:
    incident_id = _incident(store)
    _arm(store, incident_id, "baseline", 0, 8, T0)
    run = _arm(store, incident_id, "server-reasoning-off", 0, 8, T0 + timedelta(hours=1))
    with pytest.raises(DecisionError, match="never failed"):
        _decide(store, "FIXED", fix="x", evidence_keys=[run])


def test_force_records_an_unverified_fix_labelled_as_such(store: Store) -> None:
    _incident(store)
    decision = _decide(store, "FIXED", fix="restart", force=True)
    assert decision.verified is False
    assert decision.rationale.startswith("UNVERIFIED fix (recorded with --force)")
    assert _status(store) == "fixed"
    with pytest.raises(DecisionError, match="cannot record FIXED while the incident is fixed"):
        _decide(store, "FIXED", fix="again", force=True)


# --------------------------------------------------------------------------- REOPENED


def test_reopened_only_after_fixed(store: Store) -> None:
    _incident(store)
    with pytest.raises(DecisionError, match="REOPENED applies to incidents that are fixed"):
        _decide(store, "REOPENED", rationale="back")
    _decide(store, "FIXED", fix="restart", force=True)
    with pytest.raises(DecisionError, match="REOPENED first"):
        _decide(store, "PARKED", rationale="x", revisit_on=date(2026, 9, 1))
    with pytest.raises(DecisionError, match="rationale"):
        _decide(store, "REOPENED")
    decision = _decide(store, "REOPENED", rationale="the empty responses are back")
    assert decision.kind == "REOPENED"
    assert _status(store) == "reopened"
    _decide(store, "PARKED", rationale="again", revisit_on=date(2026, 12, 1))
    assert _status(store) == "parked"


# --------------------------------------------------------------------------- parked list


def test_reference_incident_is_due_once_its_revisit_date_passed(store: Store) -> None:
    import_paths(store, [INCIDENTS])
    with store.session(readonly=True) as session:
        before = parked(session, date(2026, 9, 9))
        assert [item.slug for item in before] == [REFERENCE]
        assert before[0].state == "waiting" and not before[0].due
        assert parked(session, date(2026, 9, 9), due_only=True) == []

        on_the_day = parked(session, date(2026, 9, 10), due_only=True)
        assert [item.slug for item in on_the_day] == [REFERENCE]
        assert on_the_day[0].state == "due"

        later = parked(session, date(2026, 9, 15), due_only=True)[0]
    assert later.state == "overdue" and later.days_overdue == 5
    assert later.reasons == ("revisit date 2026-09-10 passed 5 day(s) ago",)
    assert later.revisit_on == date(2026, 9, 10)
    assert "35%" in later.tradeoff
    kinds = [t.trigger["kind"] for t in later.triggers]
    assert kinds == ["date", "new-build", "new-weights", "failure-rate"]
    data = later.to_dict()
    assert data["due"] is True and data["revisit_on"] == "2026-09-10"


def test_new_build_in_newer_evidence_fires_and_a_revisit_settles_it(store: Store) -> None:
    incident_id = _incident(store, server_build="b9586")
    _evidence(store, incident_id, T0, build_info="b9586-deadbeef")
    _decide(store, "PARKED", rationale="non-core", triggers=["new-build"])
    day = date(2026, 8, 1)
    with store.session(readonly=True) as session:
        assert parked(session, day, due_only=True) == []
    # A capture not attached to any incident counts: the server was upgraded.
    seen = _evidence(
        store,
        None,
        T0 + timedelta(days=3),
        kind="exchange",
        response={"system_fingerprint": "b11434-0a1b2c3"},
    )
    with store.session(readonly=True) as session:
        item = parked(session, day, due_only=True)[0]
        # Not yet as of a day before the capture was recorded.
        assert parked(session, date(2026, 7, 3), due_only=True) == []
    assert item.state == "due"
    assert item.reasons == (f"build b11434 seen in [{seen}] (was b9586)",)
    assert item.triggers[0].evidence_keys == (seen,)

    revisit = _arm(
        store,
        incident_id,
        "revisit",
        8,
        8,
        T0 + timedelta(days=4),
        stack={"build_number": 11434},
        decision="unchanged",
    )
    with store.session(readonly=True) as session:
        item = parked(session, day)[0]
        assert item.state == "waiting"
    assert item.last_revisit == f"2026-07-05 [{revisit}]: 8/8 failed, unchanged"
    # The same new build seen again is no longer news; a newer one is.
    _evidence(
        store,
        None,
        T0 + timedelta(days=6),
        kind="exchange",
        response={"system_fingerprint": "b11434-0a1b2c3"},
    )
    with store.session(readonly=True) as session:
        assert parked(session, day, due_only=True) == []
    newer = _evidence(store, None, T0 + timedelta(days=7), server_build="b11500")
    with store.session(readonly=True) as session:
        item = parked(session, day, due_only=True)[0]
    assert item.reasons == (f"build b11500 seen in [{newer}] (was b11434)",)


def test_new_weights_hash_fires(store: Store) -> None:
    incident_id = _incident(store, stack={"weights_sha256": "aaa"})
    _decide(store, "PARKED", rationale="r", triggers=["new-weights"])
    with store.session(readonly=True) as session:
        decision = session.exec(select(Decision)).one()
        assert decision.revisit_triggers == [{"kind": "new-weights", "hash": "aaa"}]
    _evidence(store, incident_id, T0 + timedelta(days=2), weights_sha256="AAA")
    with store.session(readonly=True) as session:
        assert parked(session, date(2026, 8, 1), due_only=True) == []
    key = _evidence(store, incident_id, T0 + timedelta(days=3), stack={"weights_sha256": "bbb"})
    with store.session(readonly=True) as session:
        item = parked(session, date(2026, 8, 1), due_only=True)[0]
    assert item.reasons == (f"weights bbb seen in [{key}]",)


def _capture(store: Store, incident_id: int, at: datetime, failed: bool) -> str:
    return _evidence(
        store,
        incident_id,
        at,
        kind="exchange",
        exchange={"request": {"messages": [{"role": "user", "content": "hi"}]}},
        findings=[{"kind": "empty-content", "passed": not failed}],
    )


def test_failure_rate_over_threshold_in_new_captures_fires(store: Store) -> None:
    incident_id = _incident(store)
    _capture(store, incident_id, T0, failed=True)  # the original failure: before the decision
    _decide(store, "PARKED", rationale="r", triggers=["failure-rate>50%,min=4"])
    day = date(2026, 8, 1)
    for offset, failed in enumerate([True, False, True]):
        _capture(store, incident_id, T0 + timedelta(days=2, hours=offset), failed)
    with store.session(readonly=True) as session:
        item = parked(session, day)[0]
        assert item.state == "waiting"
        assert item.triggers[0].reason == "2/3 new captures failed (needs >= 4)"
    _capture(store, incident_id, T0 + timedelta(days=3), failed=True)
    with store.session(readonly=True) as session:
        item = parked(session, day, due_only=True)[0]
    assert item.reasons == ("3/4 new captures failed (75% > 50%)",)
    assert len(item.triggers[0].evidence_keys) == 3


def test_revisit_after_the_date_settles_it_and_no_way_back_is_due(store: Store) -> None:
    incident_id = _incident(store)
    _decide(store, "PARKED", rationale="r", revisit_on=date(2026, 8, 1))
    with store.session(readonly=True) as session:
        assert parked(session, date(2026, 8, 2), due_only=True)[0].state == "overdue"
    key = _arm(store, incident_id, "revisit", 3, 8, datetime(2026, 8, 3, tzinfo=timezone.utc))
    with store.session(readonly=True) as session:
        item = parked(session, date(2026, 8, 4))[0]
    assert item.state == "waiting"
    assert f"revisited on 2026-08-03 [{key}]" in item.triggers[0].reason

    # A parked status with no decision behind it is flagged, not silently kept.
    with store.session() as session:
        other = Incident(
            slug="2026-07-02-x", title="x", opened_on=date(2026, 7, 2), status="parked"
        )
        session.add(other)
    with store.session(readonly=True) as session:
        flagged = [i for i in parked(session, date(2026, 8, 4), due_only=True)]
    assert [i.slug for i in flagged] == ["2026-07-02-x"]
    assert "no PARKED decision" in flagged[0].reasons[0]


def test_failing_requests_come_from_failed_exchange_captures(store: Store) -> None:
    incident_id = _incident(store)
    failing = _capture(store, incident_id, T0, failed=True)
    _capture(store, incident_id, T0 + timedelta(hours=1), failed=True)  # same body: once
    _capture(store, incident_id, T0 + timedelta(hours=2), failed=False)  # passed: not replayed
    with store.session(readonly=True) as session:
        incident = get_incident(session, SLUG)
        assert incident is not None
        found = failing_requests(session, incident)
    assert found == [(failing, {"messages": [{"role": "user", "content": "hi"}]})]
