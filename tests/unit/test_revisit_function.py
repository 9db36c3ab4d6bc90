"""triage.revisit.revisit_incident called directly, with a fake replayer passed as its seam
(no llama-server, no patched module attributes): typed result, evidence written once,
the proposal for each outcome. The real server is in tests/integration/test_revisit.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from kb.domain.triggers import DecisionError
from kb.models import Cause, Evidence, Incident
from kb.repo.decisions import record_decision
from kb.repo.store import Store, add_evidence
from kb.service import KnowledgeBase
from triage.revisit import ProbeOutcome, Rate, revisit_incident

SLUG = "2026-07-01-drill"
T0 = datetime(2026, 7, 1, 12, tzinfo=timezone.utc)
AT = datetime(2026, 8, 2, 9, tzinfo=timezone.utc)


@dataclass
class Outcome:
    n: int
    failures: int
    decision: str
    ci95: list[float] | None = None
    p_value: float | None = None
    error: str = ""


class FakeReplayer:
    """Returns the given outcomes in order and remembers what it was asked to replay."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, stack, request_bodies, *, max_requests, baseline=None, log_dir=None):  # type: ignore[no-untyped-def]
        self.calls.append(
            {
                "bodies": request_bodies,
                "baseline": baseline,
                "max_requests": max_requests,
                "log_dir": log_dir,
            }
        )
        return self.outcomes[len(self.calls) - 1]


def _incident(store: Store, *, baseline: bool = True, status: str = "PARKED") -> None:
    with store.session() as session:
        incident = Incident(slug=SLUG, title="drill", opened_on=T0.date())
        session.add(incident)
        session.flush()
        request = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 800}
        add_evidence(
            session,
            incident_id=incident.id,
            kind="exchange",
            summary="failing",
            payload={
                "exchange": {"request": request},
                "findings": [{"kind": "empty-content", "passed": False}],
            },
            recorded_at=T0,
        )
        if baseline:
            add_evidence(
                session,
                incident_id=incident.id,
                kind="measurement",
                summary="arm baseline: 8/8",
                payload={"type": "arm", "arm": "baseline", "n": 8, "failures": 8},
                recorded_at=T0,
            )
        session.add(
            Cause(
                incident_id=incident.id,
                key="reasoning-exhausts-budget",
                catalogue_id="reasoning-exhausts-budget",
                title="budget",
                status="confirmed",
                deciding_probe="thinking-off",
            )
        )
    with store.session() as session:
        record_decision(session, SLUG, status, rationale="drill", revisit_on="2026-08-01", at=T0)


def _stack(tmp_path: Path) -> Path:
    # A running server by URL: no binary or weights to inspect, nothing is launched.
    stack = tmp_path / "stack.toml"
    stack.write_text('[server]\nurl = "http://127.0.0.1:9"\n')
    return stack


def _measurements(store: Store) -> list[Evidence]:
    with store.session(readonly=True) as session:
        return list(
            session.exec(
                select(Evidence).where(Evidence.kind == "measurement").order_by(Evidence.id)
            ).all()
        )


def test_gone_failure_proposes_fixed_and_records_one_run(store: Store, tmp_path: Path) -> None:
    _incident(store)
    replayer = FakeReplayer(Outcome(8, 0, "removes", [0.0, 0.37], 0.0002))
    result = revisit_incident(
        store, SLUG, _stack(tmp_path), max_requests=16, replay_rate=replayer, at=AT
    )
    assert result.proposal == "FIXED" and result.status == "parked" and not result.errored
    assert result.before == Rate(8, 8, evidence=("E2",))
    assert result.after == Rate(0, 8, 0.0, [0.0, 0.37], 0.0002, "removes")
    assert result.probes == []  # the failure is gone: no deciding probe is run
    assert "before 8/8 (100%), after 0/8 (0%), p=0.0002" in result.message
    assert replayer.calls[0]["baseline"] == (8, 8)
    assert replayer.calls[0]["max_requests"] == 16
    [run] = _measurements(store)[1:]
    assert result.evidence == [run.key]
    assert run.payload["arm"] == "revisit" and run.payload["failures"] == 0
    assert run.recorded_at.replace(tzinfo=timezone.utc) == AT
    assert result.to_dict()["after"]["decision"] == "removes"


def test_unchanged_failure_stays_parked_and_runs_the_deciding_probe(
    store: Store, tmp_path: Path
) -> None:
    _incident(store)
    replayer = FakeReplayer(Outcome(8, 8, "unchanged", p_value=1.0), Outcome(8, 0, "removes"))
    result = revisit_incident(store, SLUG, _stack(tmp_path), replay_rate=replayer, at=AT)
    assert result.proposal == "PARKED"
    assert result.message.startswith("stays PARKED: the failure is unchanged")
    assert result.probes == [
        ProbeOutcome("thinking-off", 0, 8, "removes", ("reasoning-exhausts-budget",))
    ]
    # The probe replays the request with thinking off, against the revisit's own rate.
    assert replayer.calls[1]["bodies"][0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert replayer.calls[1]["baseline"] == (8, 8)
    assert len(result.evidence) == 2 == len(_measurements(store)) - 1


def test_without_a_baseline_no_fix_is_proposed(store: Store, tmp_path: Path) -> None:
    _incident(store, baseline=False)
    result = revisit_incident(
        store, SLUG, _stack(tmp_path), replay_rate=FakeReplayer(Outcome(8, 0, "undecided")), at=AT
    )
    assert result.proposal == "PARKED" and result.before is None
    assert "no baseline failure rate on record" in result.message


def test_an_errored_run_is_recorded_but_proposes_nothing(store: Store, tmp_path: Path) -> None:
    _incident(store)
    replayer = FakeReplayer(Outcome(0, 0, "errored", error="ServerStartError: exit 1"))
    result = revisit_incident(store, SLUG, _stack(tmp_path), replay_rate=replayer, at=AT)
    assert result.errored and result.proposal == "none"
    assert "revisit errored: ServerStartError: exit 1" in result.message
    assert _measurements(store)[-1].payload["decision"] == "errored"


def test_nothing_to_revisit_is_refused_before_any_replay(store: Store, tmp_path: Path) -> None:
    replayer = FakeReplayer()
    with pytest.raises(Exception, match="no incident"):
        revisit_incident(store, SLUG, _stack(tmp_path), replay_rate=replayer)
    _incident(store)
    with pytest.raises(DecisionError, match="pass --stack STACK.toml"):
        revisit_incident(store, SLUG, None, replay_rate=replayer)
    with pytest.raises(DecisionError, match="not found"):
        revisit_incident(store, SLUG, tmp_path / "missing.toml", replay_rate=replayer)
    assert replayer.calls == []
    assert len(_measurements(store)) == 1  # only the baseline


def test_the_ui_action_is_the_same_revisit(store: Store, tmp_path: Path) -> None:
    from triage.ui import actions

    _incident(store)
    with pytest.raises(actions.ActionError, match="pass --stack STACK.toml"):
        actions.revisit(KnowledgeBase(store), SLUG, None, replay_rate=FakeReplayer())
    result = actions.revisit(
        KnowledgeBase(store),
        SLUG,
        _stack(tmp_path),
        replay_rate=FakeReplayer(Outcome(8, 0, "removes", p_value=0.0002)),
    )
    assert result.proposal == "FIXED"
    assert _measurements(store)[-1].key == result.evidence[0]
