"""Issue 25: the engine as plan -> execute(backend) -> decide -> record, each step a typed
hand-off, run end to end against a fake backend -- no llama-server, no socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fake_backend import FakeBackend

from kb.domain.diagnosis import Diagnosis, Finding, validate_diagnosis
from kb.repo.store import Store
from triage import probes
from triage.capture import exchange_from_http
from triage.catalogue import catalogue
from triage.engine import Diagnoser, exchange_findings
from triage.engine.decide import decide
from triage.engine.events import ArmsPlanned, Event, LookStarted, ProgressEvent
from triage.engine.execute import Executor
from triage.engine.plan import plan
from triage.engine.record import record
from triage.engine.servers import Server
from triage.stackfile import Stack, parse_stack
from triage.symptoms import classify

REQUEST: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
FINDINGS = [Finding("length-stop", False, 1.0, "cut", "$")]
# The fields of a finding in the diagnosis JSON (and the run's recorded plan).
FINDING_KEYS = ("kind", "passed", "score", "reason", "where")


def _stack(tmp_path: Path) -> Stack:
    (tmp_path / "m.gguf").write_bytes(b"not a real model")
    return parse_stack(
        '[server]\nmodel = "m.gguf"\nargs = ["-c", "2048"]\n',
        base=tmp_path,
        source=str(tmp_path / "stack.toml"),
    )


def _cut_at_the_limit(arm: str, body: dict[str, Any], server: Server, index: int) -> bool:
    """The failure: the reply is cut at max_tokens 64; a larger limit lets it finish."""
    return int(body.get("max_tokens") or 0) <= 64


def _statuses(diagnosis: Diagnosis) -> dict[str, str]:
    return {c.id: c.status for c in diagnosis.causes}


def test_plan_execute_decide_record_against_a_fake_backend(store: Store, tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    found = catalogue()
    the_plan = plan(stack, REQUEST, list(found.arms), list(found.causes))
    assert "token-limit-lifted" in the_plan.arms and not the_plan.crashed

    backend = FakeBackend(_cut_at_the_limit)
    diagnoser = Diagnoser(store, stack, REQUEST, findings=FINDINGS, backend=backend)
    diagnoser._prepare(the_plan)  # the incident and the run row
    executor = Executor(
        the_plan,
        exchange={},
        signature=diagnoser.signature,
        options=diagnoser.progress.options,
        backend=backend,
        recorder=diagnoser.recorder,
        progress=diagnoser.progress,
        secrets=[],
    )
    base = Server(stack.server.key(), stack.server, "http://fake.invalid/base", 2, 0.0)
    executor.execution.servers[base.key] = base
    execution = asyncio.run(executor.run(base, tmp_path / "logs"))
    assert execution.reproduction is not None and execution.reproduction.reproduced

    decision = decide(execution, [], 1.0)
    verdicts = {v.cause: v.status for v in decision.verdicts}
    assert verdicts["token-limit"] == "confirmed"
    assert [c for c, s in verdicts.items() if s == "confirmed"] == ["token-limit"]
    lifted = next(s for s in decision.summaries if s.arm == "token-limit-lifted")
    baseline = next(s for s in decision.summaries if s.arm == "baseline")
    assert lifted.failures == 0 and lifted.n >= 4 and lifted.decision == "removes"
    assert baseline.failures == baseline.n >= 4

    diagnosis = record(diagnoser.recorder, decision, FINDINGS, execution.plan.skipped)
    validate_diagnosis(diagnosis.to_json())
    assert _statuses(diagnosis)["token-limit"] == "confirmed"
    # Every reply was journaled as it came in: a resumed run would find them.
    stored = diagnoser.recorder.previous_replies()
    assert {r.arm for r in stored} >= {"baseline", "token-limit-lifted"}
    assert len(stored) == sum(len(a.replies) for a in execution.arms.values())


def test_a_run_through_the_diagnoser_plans_once_and_reports_typed_events(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = []
    real_plan_arms = probes.plan_arms

    def counting(*args: Any, **kwargs: Any) -> list[probes.PlannedArm]:
        planned.append(1)
        return real_plan_arms(*args, **kwargs)

    monkeypatch.setattr(probes, "plan_arms", counting)
    events: list[Event] = []
    backend = FakeBackend(_cut_at_the_limit)
    diagnosis = Diagnoser(
        store, _stack(tmp_path), REQUEST, findings=FINDINGS, progress=events.append,
        backend=backend,
    ).run()  # fmt: skip
    validate_diagnosis(diagnosis.to_json())
    assert len(planned) == 1  # the plan is computed once
    assert _statuses(diagnosis)["token-limit"] == "confirmed"
    assert diagnosis.state == "done"
    # The incident's server and the server-level arm's were launched, by the backend.
    assert len(backend.launched) == 2
    plans = [e for e in events if isinstance(e, ArmsPlanned)]
    assert len(plans) == 1 and plans[0].request_arms >= 5 and plans[0].server_arms == 1
    looks = [e for e in events if isinstance(e, LookStarted)]
    assert looks and looks[0].done == 1 and "token-limit-lifted" in looks[0].arms
    assert isinstance(events[-1], ProgressEvent) and events[-1].stage == "done"


def test_a_baseline_that_fails_differently_stops_every_arm_and_moves_no_cause(
    store: Store, tmp_path: Path
) -> None:
    # The capture was cut at the limit; the replays come back empty instead.
    backend = FakeBackend(lambda arm, body, server, index: True, kinds=("empty-content",))
    diagnosis = Diagnoser(
        store, _stack(tmp_path), REQUEST, findings=FINDINGS, backend=backend
    ).run()
    data = diagnosis.to_json()
    validate_diagnosis(data)
    assert data["state"] == "not-reproduced"
    assert "empty-content" in data["reproduction"]["message"]
    assert data["arms"] == []
    assert "confirmed" not in _statuses(diagnosis).values()
    replayed = {arm for r in backend.replayers for arm in r.sent}
    assert replayed == {"baseline"}  # the gate: no other arm replayed


def test_crash_mode_is_the_same_plan_arranged_for_a_crashed_server(tmp_path: Path) -> None:
    found = catalogue()
    normal = plan(_stack(tmp_path), REQUEST, list(found.arms), list(found.causes))
    crashed = normal.for_crash()
    assert crashed.every == normal.every  # not planned again
    assert crashed.request_arms == [crashed.arms["baseline"]]
    skipped = {s.arm: s.reason for s in crashed.skipped}
    assert skipped["token-limit-lifted"] == "the incident's server crashed: it serves no request"
    assert "no-repack" in crashed.arms and "no-repack" not in normal.arms
    assert {c.id for c in crashed.causes} > {c.id for c in normal.causes}
    assert crashed.known_good == {} and crashed.observe_only == ()


def test_findings_become_json_in_one_place_with_the_diagnosis_fields() -> None:
    response = {
        "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
        "usage": {"completion_tokens": 64},
    }
    exchange = exchange_from_http(REQUEST, response, status=200)
    findings = exchange_findings(exchange)
    failed = [f for f in findings if not f.passed]
    assert failed and {f.kind for f in failed} == {
        f.kind for f in classify(exchange) if not f.passed
    }
    # No offset: as the CLI records them; the model-file lint's findings keep theirs.
    assert all(tuple(f.to_json()) == FINDING_KEYS for f in findings)
    lint = classify(exchange)[0].record(with_offset=True).to_json()
    assert tuple(lint) == (*FINDING_KEYS, "offset")
