"""Arms that cannot matter are not run (issue 23): each arm declares its precondition, the
plan names every skipped arm with the reason, and the thinking arms are dropped once the
template render shows the request does not think."""

from __future__ import annotations

from typing import Any

from kb.domain.diagnosis import Diagnosis
from triage import probes
from triage.commands.engine import format_diagnosis
from triage.engine import DiagnoseOptions, Diagnoser
from triage.engine.naming import ModelIdentity
from triage.stackfile import ServerConfig, Stack, parse_stack

CHAT = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 24}
THINKING_ARMS = ("thinking-off", "no-think-suffix", "reasoning-budget")


def _stack(*args: str) -> Stack:
    return Stack(ServerConfig(None, None, tuple(args)))


def test_every_arm_not_planned_is_listed_with_what_it_needs() -> None:
    skipped = dict(probes.skipped_arms(_stack("-c", "2048", "-np", "1"), CHAT))
    planned = {a.name for a in probes.plan_arms(_stack("-c", "2048", "-np", "1"), CHAT)}
    assert not set(skipped) & planned
    assert "speculative-decoding flags" in skipped["spec-off"]
    assert "[alternates] model" in skipped["alt-weights"]
    assert "response_format" in skipped["no-structured-output"]
    # 24 tokens cannot reach a 2048-token slot: a larger context cannot matter.
    assert "-c set" in skipped["context-lifted"]
    assert all(why for why in skipped.values())


def _render(thinking_on: bool, changes: bool) -> dict[str, Any]:
    return {
        "template-render": {
            "name": "template-render",
            "thinking_on": thinking_on,
            "enable_thinking_false_changes_prompt": changes,
        }
    }


def test_thinking_arms_need_a_request_that_thinks() -> None:
    thinking = {a.name: a for a in probes.plan_arms(_stack(), CHAT) if a.name in THINKING_ARMS}
    assert set(thinking) == set(THINKING_ARMS)
    for arm in thinking.values():
        assert arm.requires is not None
        why = arm.requires(_render(False, False), None)
        assert why is not None and "thinking is off for this request" in why
        assert arm.requires(_render(True, True), None) is None
        # The template switches something with enable_thinking=false: it may matter.
        assert arm.requires(_render(False, True), None) is None
        # The model thought although the template shows no marker: it may matter.
        reply = {"response": {"choices": [{"message": {"reasoning_content": "Let me see"}}]}}
        assert arm.requires(_render(False, False), reply) is None
        # No render (an error, an old server): run it rather than guess.
        assert arm.requires({"template-render": {"error": "404"}}, None) is None


def test_the_server_reasoning_off_arm_has_the_same_precondition() -> None:
    stack = Stack(ServerConfig(None, "model.gguf", ("-c", "2048")))
    (arm,) = [a for a in probes.plan_arms(stack, CHAT) if a.name == "server-reasoning-off"]
    assert arm.requires is not None and arm.requires(_render(False, False), None)


def test_skipped_arms_are_printed_with_their_reason() -> None:
    diagnosis = Diagnosis.from_json(
        {
            "incident": "i",
            "run_id": 1,
            "arms": [],
            "causes": [],
            "skipped_arms": [{"arm": "thinking-off", "reason": "thinking is off for this request"}],
        }
    )
    text = format_diagnosis(diagnosis)
    assert "Arms not run (they cannot matter here):" in text
    assert "thinking-off" in text and "thinking is off for this request" in text


def test_preconditions_can_be_switched_off_to_measure_what_they_save(
    store: Any, tmp_path: Any
) -> None:
    stack = parse_stack('[server]\nurl = "http://127.0.0.1:9"\n', base=tmp_path, source="s.toml")
    off = {"template-render": {"name": "template-render", "thinking_on": False}}
    kept = []
    for check in (True, False):
        options = DiagnoseOptions(check_preconditions=check)
        diagnoser = Diagnoser(store, stack, CHAT, options=options)
        diagnoser.identity = ModelIdentity("m")
        assert "thinking-off" in diagnoser.plan.arms
        diagnoser._prepare(diagnoser.plan)
        executor = diagnoser._executor(diagnoser.plan, None)
        executor.execution.facts.update(off)
        executor._skip_unmet()
        kept.append("thinking-off" in executor.plan.arms)
    assert kept == [False, True]
