"""Request-field ablation (issue 23): one field of the captured request neutralised at a
time names the field whose removal removes the failure -- held back until no cause is
confirmed, with the same statistics against the same baseline as every arm."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fake_backend import FakeBackend, FakeReplayer

from kb.domain.diagnosis import Finding, Reproduction, validate_diagnosis
from kb.domain.records import Reply
from kb.repo.store import Store
from triage import probes
from triage.causes import Verdict
from triage.commands.engine import format_diagnosis
from triage.engine import Diagnoser
from triage.engine.arms.ablation import ARMS, FAMILY, HELD_BACK
from triage.engine.decide import decide
from triage.engine.execute import Executor
from triage.engine.naming import ModelIdentity
from triage.engine.record import record
from triage.engine.servers import Server
from triage.stackfile import ServerConfig, Stack, parse_stack

REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "List three colours."},
    ],
    "stop": ["\n"],
    "temperature": 0.7,
    "logit_bias": {"13": -100},
}


def _planned(request: dict[str, Any]) -> dict[str, probes.PlannedArm]:
    out = {}
    for arm in ARMS:
        item = arm.plan(Stack(ServerConfig()), request)
        if item is not None:
            out[item.name] = item
    return out


def test_one_arm_per_field_group_the_request_sets() -> None:
    planned = _planned(REQUEST)
    assert set(planned) == {
        "without-stop",
        "without-sampling",
        "without-logit-bias",
        "without-system-message",
    }
    assert all(p.when == HELD_BACK and p.decides == () for p in planned.values())
    body = planned["without-stop"].transform(REQUEST)
    assert "stop" not in body and body["temperature"] == 0.7 and "stop" in REQUEST
    body = planned["without-sampling"].transform(REQUEST)
    assert "temperature" not in body and body["stop"] == ["\n"]
    body = planned["without-system-message"].transform(REQUEST)
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert "stop=['\\n']" in planned["without-stop"].variant


def test_a_request_with_only_messages_plans_none_and_the_plan_says_so_in_one_line() -> None:
    bare = {"messages": [{"role": "user", "content": "hi"}]}
    assert _planned(bare) == {}
    only_system = {"messages": [{"role": "system", "content": "x"}], "stop": "a"}
    assert "without-system-message" not in _planned(only_system)
    skipped = dict(probes.skipped_arms(Stack(ServerConfig()), bare))
    assert not any(name.startswith("without-") for name in skipped)
    assert "without-stop" in skipped[FAMILY] and "without-tools" in skipped[FAMILY]


def _reply(arm: str, index: int, failed: bool) -> Reply:
    kinds = ["empty-content"] if failed else []
    return Reply(
        arm, index, 1000 + index, failed, kinds, "stop", 0, 3, 200, 1.0, {}
    )  # fmt: skip


def _stop_cuts_it(arm: str, body: dict[str, Any], server: Server, index: int) -> bool:
    """Every reply is empty (the stop string cuts it at once) unless `stop` is removed."""
    return "stop" in body


def _executor(store: Store, tmp_path: Path) -> tuple[Executor, FakeReplayer, Server, Diagnoser]:
    stack = parse_stack('[server]\nurl = "http://127.0.0.1:9"\n', base=tmp_path, source="s.toml")
    findings = [Finding("empty-content", False, 1.0, "empty", "$")]
    diagnoser = Diagnoser(store, stack, REQUEST, findings=findings)
    diagnoser.identity = ModelIdentity("some-model")
    plan = diagnoser.plan
    held = [p.name for p in plan.held_back]
    assert set(held) == set(_planned(REQUEST)) and not set(held) & set(plan.arms)
    # Only the baseline stands for the catalogue's arms here: 8/8 failing.
    plan = dataclasses.replace(plan, arms={"baseline": plan.arms["baseline"]})
    diagnoser._prepare(plan)
    backend = FakeBackend(_stop_cuts_it, kinds=("empty-content",))
    executor = Executor(
        plan,
        exchange={},
        signature=diagnoser.signature,
        options=diagnoser.progress.options,
        backend=backend,
        recorder=diagnoser.recorder,
        progress=diagnoser.progress,
        secrets=[],
    )
    executor.arms["baseline"].replies = [_reply("baseline", i, True) for i in range(8)]
    executor.execution.reproduction = Reproduction(True, "reproduced")
    base = Server("incident", stack.server, "http://127.0.0.1:9", 1, 0.0)
    return executor, backend.replayers[0], base, diagnoser


def test_unexplained_runs_the_ablation_and_names_the_field(store: Store, tmp_path: Path) -> None:
    executor, replayer, base, diagnoser = _executor(store, tmp_path)
    asyncio.run(executor._run_held_back(None, base))  # type: ignore[arg-type]  # no pool needed
    assert set(replayer.sent) == {"without-stop", "without-sampling", "without-logit-bias",
                                  "without-system-message"}  # fmt: skip
    execution = executor.execution
    recorded = record(
        diagnoser.recorder, decide(execution, [], 0.0), diagnoser.findings, execution.plan.skipped
    )
    diagnosis = recorded.to_json()
    validate_diagnosis(diagnosis)
    arms = {a["name"]: a for a in diagnosis["arms"]}
    assert arms["without-stop"]["decision"] == "removes"
    assert arms["without-stop"]["failures"] == 0 and arms["without-stop"]["n"] >= 8
    assert arms["without-sampling"]["decision"] == "unchanged"
    verdict = diagnosis["verdict"]
    assert verdict["status"] == "unexplained"
    assert len(verdict["request_fields"]) == 1
    assert verdict["request_fields"][0].startswith("stop (without-stop 0/")
    assert "vs baseline 8/8" in verdict["request_fields"][0]
    assert "removing one request field removes it: stop" in format_diagnosis(recorded)


def test_a_confirmed_cause_keeps_the_ablation_from_running(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor, replayer, base, _ = _executor(store, tmp_path)
    confirmed = [Verdict("token-limit", "confirmed", "lifted 0/8 vs 8/8")]
    monkeypatch.setattr(executor.rules, "verdicts", lambda outcomes: confirmed)
    asyncio.run(executor._run_held_back(None, base))  # type: ignore[arg-type]
    assert replayer.sent == {}
    skipped = {s.arm: s.reason for s in executor.plan.skipped}
    assert "token-limit is" in skipped["without-stop"]
    assert "without-stop" not in executor.arms
