"""structured-output and reasoning-leak: their symptom checks, arms and rules (issue 13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triage import symptoms
from triage.causes import ArmOutcome, Observations, decide
from triage.engine.arms.reasoning_format import (
    REQUEST_ARM,
    SERVER_ARM,
    server_reasoning_format,
)
from triage.engine.arms.structured_output import without_structured_output
from triage.probes import plan_arms
from triage.stackfile import ServerConfig, Stack

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GRAMMAR = 'root ::= "{" [^}]* "}"'


def _reply(content: str, reasoning: str | None = None, finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"choices": [{"message": message, "finish_reason": finish}]}


def _request(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Where?"}], "max_tokens": 120, **extra}


def _failed(exchange: dict[str, Any], kind: str) -> list[Any]:
    return [f for f in symptoms.classify(exchange) if f.kind == kind and not f.passed]


# --- checks -------------------------------------------------------------------------------


def test_structured_answer_inside_the_thought_is_flagged_for_every_constraint_field() -> None:
    for extra in (
        {"grammar": GRAMMAR},
        {"json_schema": SCHEMA},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
    ):
        exchange = {"request": _request(**extra), "response": _reply("", '{"city": "Paris"}')}
        (finding,) = _failed(exchange, "structured-output-failed")
        assert "landed in the thought" in finding.reason
        assert finding.where == "$.response.choices[0].message.reasoning_content"
        assert symptoms.is_failure(exchange)


def test_server_refusing_the_output_of_a_structured_request_is_flagged() -> None:
    exchange = {
        "request": _request(response_format={"type": "json_object"}),
        "status": 500,
        "error": {
            "code": 500,
            "message": "The model produced output that does not match the expected "
            "peg-gemma4 format",
        },
    }
    (finding,) = _failed(exchange, "structured-output-failed")
    assert "HTTP 500" in finding.reason and "response_format json_object" in finding.reason
    assert finding.where == "$.error.message"


def test_structured_output_check_passes_plain_requests_and_answers() -> None:
    # Same reply without a constraint: a budget or parsing problem, not this one.
    plain = {"request": _request(), "response": _reply("", "thinking...")}
    assert _failed(plain, "structured-output-failed") == []
    answered = {
        "request": _request(grammar=GRAMMAR),
        "response": _reply('{"city": "Paris"}', "The user wants JSON."),
    }
    assert _failed(answered, "structured-output-failed") == []
    text_format = {"request": _request(response_format={"type": "text"}), "response": _reply("")}
    assert _failed(text_format, "structured-output-failed") == []


def test_thought_markup_in_content_is_flagged_with_its_offset() -> None:
    cases = {
        "<|channel>thought\nThe user wants Paris.<channel|>Paris.": "<|channel>thought",
        "Sure. <think>hmm</think> Paris.": "<think>",
        "[THINK]plan[/THINK]Paris": "[THINK]",
        "<|channel|>analysis<|message|>x<|end|>": "<|channel|>analysis",
    }
    for content, markup in cases.items():
        exchange = {"request": _request(), "response": _reply(content)}
        (finding,) = _failed(exchange, "reasoning-markup-in-content")
        assert markup in finding.reason
        assert finding.offset == content.index(markup)
        assert symptoms.is_failure(exchange)


def test_markup_check_passes_clean_content_and_markup_inside_reasoning() -> None:
    clean = {"request": _request(), "response": _reply("I think Paris is the channel.")}
    assert _failed(clean, "reasoning-markup-in-content") == []
    in_reasoning = {"request": _request(), "response": _reply("Paris", "<think>x</think>")}
    assert _failed(in_reasoning, "reasoning-markup-in-content") == []


# --- arms ---------------------------------------------------------------------------------


def _stack(*args: str) -> Stack:
    return Stack(ServerConfig(Path("/bin/llama-server"), Path("/m.gguf"), tuple(args)))


def _planned(stack: Stack, request: dict[str, Any]) -> dict[str, Any]:
    return {arm.name: arm for arm in plan_arms(stack, request)}


def test_no_structured_output_arm_only_for_constrained_requests() -> None:
    assert "no-structured-output" not in _planned(_stack(), _request())
    request = _request(grammar=GRAMMAR, response_format={"type": "json_object"}, seed=3)
    arm = _planned(_stack(), request)["no-structured-output"]
    assert "structured-output" in arm.decides
    body = arm.transform(request)
    assert "grammar" not in body and "response_format" not in body and body["seed"] == 3
    assert request["grammar"] == GRAMMAR  # the original is not mutated
    kept = without_structured_output(_request(response_format={"type": "text"}))
    assert kept["response_format"] == {"type": "text"}


def test_reasoning_format_arms_only_when_the_format_leaks() -> None:
    assert SERVER_ARM not in _planned(_stack("-c", "4096"), _request())
    assert SERVER_ARM not in _planned(_stack("--reasoning-format", "deepseek"), _request())
    arm = _planned(_stack("-c", "4096", "--reasoning-format", "none"), _request())[SERVER_ARM]
    assert arm.config is not None
    assert server_reasoning_format(arm.config.args) == "auto"
    assert list(arm.config.args).count("--reasoning-format") == 1
    assert "-c" in arm.config.args
    assert server_reasoning_format(["--reasoning-format=deepseek-legacy"]) == "deepseek-legacy"
    # A running server cannot be relaunched.
    running = Stack(ServerConfig(url="http://127.0.0.1:8080", args=("--reasoning-format", "none")))
    assert SERVER_ARM not in _planned(running, _request())
    assert REQUEST_ARM not in _planned(_stack(), _request())
    request_arm = _planned(_stack(), _request(reasoning_format="none"))[REQUEST_ARM]
    assert request_arm.transform(_request(reasoning_format="none"))["reasoning_format"] == "auto"


# --- rules --------------------------------------------------------------------------------


def _arm(name: str, k: int, n: int, decision: str, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001, kind_counts=counts)


def _verdicts(arms: dict[str, ArmOutcome], planned: tuple[str, ...]) -> dict[str, Any]:
    obs = Observations(thinking_on_by_default=True, planned=("baseline", *planned))
    return {v.cause: v for v in decide(arms, obs)}


STRUCTURED_BASE = _arm("baseline", 8, 8, "baseline", empty_content=8, structured_output_failed=8)
STRUCTURED_PLAN = ("thinking-off", "no-structured-output", "token-limit-lifted")


def test_structured_output_confirmed_when_both_halves_of_the_conflict_remove_it() -> None:
    arms = {
        "baseline": STRUCTURED_BASE,
        "thinking-off": _arm("thinking-off", 0, 8, "removes"),
        "no-structured-output": _arm("no-structured-output", 0, 8, "removes"),
        "token-limit-lifted": _arm(
            "token-limit-lifted", 4, 4, "unchanged", structured_output_failed=4
        ),
    }
    verdicts = _verdicts(arms, STRUCTURED_PLAN)
    verdict = verdicts["structured-output"]
    assert verdict.status == "confirmed"
    assert "8/8" in verdict.rationale and "0/8" in verdict.rationale
    assert "max_tokens lifted to the slot's context 4/4" in verdict.rationale
    assert verdict.supports == ["baseline", "no-structured-output", "thinking-off"]
    # The other reasoning causes are not confirmed by the same evidence.
    assert verdicts["reasoning-exhausts-budget"].status == "rejected"  # no length stop
    assert verdicts["reasoning-leak"].status == "rejected"  # no markup in content


def test_structured_output_needs_thinking_off_too() -> None:
    arms = {
        "baseline": STRUCTURED_BASE,
        "thinking-off": _arm("thinking-off", 8, 8, "unchanged", structured_output_failed=8),
        "no-structured-output": _arm("no-structured-output", 0, 8, "removes"),
    }
    verdict = _verdicts(arms, STRUCTURED_PLAN)["structured-output"]
    assert verdict.status == "rejected" and verdict.refutes == ["thinking-off"]
    assert "the grammar/schema itself fails" in verdict.rationale
    # One half removing it while the other is still undecided decides nothing yet, and
    # thinking-off's outcome keeps mattering (the scheduler must not stop it early).
    for undecided in ("thinking-off", "no-structured-output"):
        other = "no-structured-output" if undecided == "thinking-off" else "thinking-off"
        arms = {
            "baseline": STRUCTURED_BASE,
            other: _arm(other, 0, 8, "removes"),
            undecided: _arm(undecided, 0, 4, "undecided"),
        }
        assert _verdicts(arms, STRUCTURED_PLAN)["structured-output"].status == "suspected"


def test_structured_output_rejected_without_a_constraint_or_when_removal_changes_nothing() -> None:
    plain = {"baseline": _arm("baseline", 8, 8, "baseline", length_stop=8)}
    verdict = _verdicts(plain, ("thinking-off",))["structured-output"]
    assert verdict.status == "rejected" and "no structured-output-failed" in verdict.rationale
    arms = {
        "baseline": STRUCTURED_BASE,
        "no-structured-output": _arm("no-structured-output", 4, 4, "unchanged", empty_content=4),
        "thinking-off": _arm("thinking-off", 0, 8, "removes"),
    }
    verdict = _verdicts(arms, STRUCTURED_PLAN)["structured-output"]
    assert verdict.status == "rejected" and verdict.refutes == ["no-structured-output"]
    # Failing replies that kept their structured content: another failure, not this one.
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", tool_args_invalid_json=8),
        "no-structured-output": _arm("no-structured-output", 0, 8, "removes"),
        "thinking-off": _arm("thinking-off", 0, 8, "removes"),
    }
    verdict = _verdicts(arms, STRUCTURED_PLAN)["structured-output"]
    assert verdict.status == "rejected" and "lost a structured answer" in verdict.rationale


def test_structured_output_never_confirmed_when_the_baseline_does_not_reproduce() -> None:
    arms = {
        "baseline": _arm("baseline", 0, 16, "baseline"),
        "thinking-off": _arm("thinking-off", 0, 16, "no-baseline-failure"),
        "no-structured-output": _arm("no-structured-output", 0, 16, "no-baseline-failure"),
    }
    verdict = _verdicts(arms, STRUCTURED_PLAN)["structured-output"]
    assert verdict.status == "suspected" and verdict.basis == "untested"


LEAK_BASE = _arm("baseline", 8, 8, "baseline", reasoning_markup_in_content=8)


def test_reasoning_leak_confirmed_by_the_arm_that_restores_the_parser() -> None:
    for arm_name in (SERVER_ARM, REQUEST_ARM, "alt-build"):
        arms = {
            "baseline": LEAK_BASE,
            "thinking-off": _arm("thinking-off", 0, 8, "removes"),
            arm_name: _arm(arm_name, 0, 8, "removes"),
        }
        verdicts = _verdicts(arms, ("thinking-off", arm_name))
        verdict = verdicts["reasoning-leak"]
        assert verdict.status == "confirmed", arm_name
        assert arm_name in verdict.supports and "8/8" in verdict.rationale
        assert verdicts["structured-output"].status == "rejected"  # no constraint planned


def test_thinking_off_alone_never_confirms_reasoning_leak() -> None:
    arms = {"baseline": LEAK_BASE, "thinking-off": _arm("thinking-off", 0, 8, "removes")}
    verdict = _verdicts(arms, ("thinking-off",))["reasoning-leak"]
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "--reasoning-format auto" in verdict.deciding_probe


def test_reasoning_leak_rejected_without_markup_or_when_the_format_changes_nothing() -> None:
    arms = {"baseline": _arm("baseline", 8, 8, "baseline", empty_content=8, length_stop=8)}
    verdict = _verdicts(arms, ())["reasoning-leak"]
    assert verdict.status == "rejected" and "none of the 8" in verdict.rationale
    arms = {
        "baseline": LEAK_BASE,
        SERVER_ARM: _arm(SERVER_ARM, 4, 4, "unchanged", reasoning_markup_in_content=4),
    }
    verdict = _verdicts(arms, (SERVER_ARM,))["reasoning-leak"]
    assert verdict.status == "rejected" and verdict.refutes == [SERVER_ARM]


def test_reasoning_leak_undecided_arm_stays_suspected() -> None:
    arms = {
        "baseline": _arm("baseline", 5, 40, "baseline", reasoning_markup_in_content=5),
        SERVER_ARM: _arm(SERVER_ARM, 2, 40, "undecided", reasoning_markup_in_content=2),
    }
    verdict = _verdicts(arms, (SERVER_ARM,))["reasoning-leak"]
    assert verdict.status == "suspected" and "undecided" in verdict.rationale
