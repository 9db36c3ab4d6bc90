"""context-size and context-shift: rules, arms (when they are planned), the context-fill
facts and the repetition-to-context-end check."""

from __future__ import annotations

from typing import Any

import pytest

from triage import symptoms
from triage.causes import ArmOutcome, Observations
from triage.checks.base import view
from triage.checks.context import check_repetition_to_context_end
from triage.engine.arms import context_shift, context_size
from triage.engine.causes import context_shift as shift_cause
from triage.engine.causes import context_size as size_cause
from triage.stackfile import ServerConfig, Stack


def _arm(name: str, k: int, n: int, decision: str, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001, kind_counts=counts)


def _stack(*args: str) -> Stack:
    return Stack(ServerConfig(None, "m.gguf", tuple(args)))


ASK = {"messages": [{"role": "user", "content": "Write the log."}]}


# --------------------------------------------------------------------------- context-size

FILL = {
    "name": "context-fill",
    "n_ctx_slot": 256,
    "prompt_tokens": 100,
    "completion_tokens": 156,
    "tokens_used": 256,
    "finish_reason": "length",
    "reached_context": True,
    "max_tokens": 1024,
    "always_fits": False,
    "arm": {"n_ctx_slot": 1024},
}


def _size(arms: dict[str, ArmOutcome], facts: dict[str, Any] | None = None, planned=True):  # type: ignore[no-untyped-def]
    obs = Observations(
        facts={"context-fill": facts} if facts else {},
        planned=("baseline", "context-lifted") if planned else ("baseline",),
    )
    return size_cause.CAUSE.decide(arms, obs)


def test_context_size_confirmed_when_a_larger_context_removes_the_length_stops() -> None:
    verdict = _size(
        {
            "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
            "context-lifted": _arm("context-lifted", 0, 8, "removes"),
        },
        FILL,
    )
    assert verdict.status == "confirmed"
    assert "0/8" in verdict.rationale and "8/8" in verdict.rationale
    assert "used 256 of the slot's 256" in verdict.rationale
    assert verdict.supports == ["context-lifted", "context-fill"]


def test_context_size_never_confirmed_when_the_baseline_does_not_reproduce() -> None:
    verdict = _size(
        {
            "baseline": _arm("baseline", 0, 8, "baseline"),
            "context-lifted": _arm("context-lifted", 0, 8, "removes"),
        },
        FILL,
    )
    assert verdict.status == "suspected"
    assert "did not reproduce" in verdict.rationale


def test_context_size_rejected_when_a_larger_context_changes_nothing() -> None:
    verdict = _size(
        {
            "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
            "context-lifted": _arm("context-lifted", 8, 8, "unchanged", length_stop=8),
        },
        FILL,
    )
    assert verdict.status == "rejected"
    assert verdict.refutes == ["context-lifted"]


def test_context_size_rejected_when_no_failure_stops_on_a_limit() -> None:
    verdict = _size(
        {"baseline": _arm("baseline", 5, 16, "baseline", tool_args_invalid_json=5)}, None, False
    )
    assert verdict.status == "rejected"
    assert "none of the 5 failing baseline replies" in verdict.rationale


def test_context_size_rejected_when_prompt_plus_max_tokens_fits_the_slot() -> None:
    fits = {**FILL, "prompt_tokens": 40, "max_tokens": 100, "always_fits": True}
    verdict = _size(
        {
            "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
            "context-lifted": _arm("context-lifted", 0, 8, "removes"),
        },
        fits,
    )
    assert verdict.status == "rejected"
    assert "fits the slot's 256-token context" in verdict.rationale


def test_context_size_untested_without_the_arm() -> None:
    verdict = _size({"baseline": _arm("baseline", 8, 8, "baseline", length_stop=8)}, None, False)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "context-lifted" in verdict.deciding_probe


def test_context_size_suspected_when_the_length_stop_came_before_the_context_end() -> None:
    early = {**FILL, "tokens_used": 120, "reached_context": False}
    verdict = _size(
        {
            "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
            "context-lifted": _arm("context-lifted", 0, 8, "removes"),
        },
        early,
    )
    assert verdict.status == "suspected"


def test_context_lifted_to_what_the_reply_can_need_only_when_it_can_reach_the_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arm = context_size.ContextLifted()
    small = _stack("-c", "1024", "-np", "4", "-t", "1")
    request = {**ASK, "max_tokens": 1024}
    bound = context_size.prompt_token_bound(request)
    planned = arm.plan(small, request)
    assert planned is not None and planned.decides == ("context-size",)
    assert planned.config is not None
    # Lifted to prompt bound + max_tokens per slot, same slots -- not a multiple of -c.
    per_slot = bound + 1024 + context_size.CONTEXT_END_SLACK
    assert list(planned.config.args) == ["-np", "4", "-t", "1", "-c", str(4 * per_slot)]
    assert f"{per_slot} tokens per slot (was 256)" in planned.variant
    assert planned.observe is context_size.context_fill
    # No max_tokens: the answer allowance takes its place.
    unbounded = arm.plan(small, ASK)
    assert unbounded is not None and unbounded.config is not None
    allowance = context_size.prompt_token_bound(ASK) + context_size.ANSWER_ALLOWANCE + 2
    assert list(unbounded.config.args)[-1] == str(4 * allowance)
    # The shared drills' shape: 4 slots of 4096 tokens, max_tokens 800, a short prompt.
    assert arm.plan(_stack("-c", "16384", "-np", "4"), {**ASK, "max_tokens": 800}) is None
    # No request to judge (a stack's arms listed without one).
    assert arm.plan(small, {}) is None
    # No explicit -c: the context comes from the model file.
    assert arm.plan(_stack("-np", "4"), ASK) is None
    # --ctx-size=N spelling, auto slots (4).
    spelled = arm.plan(_stack("--ctx-size=2048"), {**ASK, "max_tokens": 600})
    assert spelled is not None and spelled.config is not None
    assert list(spelled.config.args) == ["-c", str(4 * (bound + 600 + 2))]
    # A running server given by URL only cannot be relaunched.
    url_only = Stack(ServerConfig(None, None, ("-c", "256"), url="http://127.0.0.1:1"))
    assert arm.plan(url_only, ASK) is None
    # Bounded by the model's trained context; nothing to lift when it is the slot already.
    monkeypatch.setattr(context_size, "trained_context", lambda model: 512)
    capped = arm.plan(small, ASK)
    assert capped is not None and capped.config is not None
    assert list(capped.config.args)[-1] == "2048" and "trained context 512" in capped.variant
    monkeypatch.setattr(context_size, "trained_context", lambda model: 256)
    assert arm.plan(small, ASK) is None
    why = context_size.unplanned_reason(context_size.context_plan(small, ASK))
    assert "trained context (256 tokens) is no larger than the 256-token slot" in why


def test_prompt_token_bound_is_an_upper_bound_on_tokens() -> None:
    long_prompt = {"messages": [{"role": "user", "content": "x" * 5000}], "max_tokens": 100}
    assert context_size.prompt_token_bound(long_prompt) > 5000
    assert context_size.could_reach_context(["-c", "16384", "-np", "4"], long_prompt)


def test_fill_facts_from_a_reply_cut_at_the_context_end() -> None:
    props = {"default_generation_settings": {"n_ctx": 256}}
    body = {
        "choices": [{"finish_reason": "length", "message": {"content": "05:12 Harbour"}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 156},
        "__verbose": {"truncated": False},
    }
    facts = context_size.fill_facts(props, 200, body)
    assert facts["n_ctx_slot"] == 256 and facts["tokens_used"] == 256
    assert facts["reached_context"] is True and facts["exceeded"] is False
    short = {**body, "usage": {"prompt_tokens": 100, "completion_tokens": 20}}
    assert context_size.fill_facts(props, 200, short)["reached_context"] is False
    facts["max_tokens"] = 1024
    assert context_size.always_fits(facts) is False
    assert context_size.always_fits({**facts, "prompt_tokens": 10, "max_tokens": 100})


def test_fill_facts_from_the_servers_refusal() -> None:
    body = {
        "error": {
            "code": 400,
            "message": "request (300 tokens) exceeds the available context size (256 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 300,
            "n_ctx": 256,
        }
    }
    facts = context_size.fill_facts({}, 400, body)
    assert facts["exceeded"] is True and facts["reached_context"] is True
    assert facts["prompt_tokens"] == 300 and facts["n_ctx_slot"] == 256
    verdict = _size(
        {
            "baseline": _arm("baseline", 8, 8, "baseline", http_error=8),
            "context-lifted": _arm("context-lifted", 0, 8, "removes"),
        },
        facts,
    )
    assert verdict.status == "confirmed"
    assert "refused the prompt (300 tokens)" in verdict.rationale


# -------------------------------------------------------------------------- context-shift

PLANNED_BOTH = ("baseline", "max-tokens-set", "context-shift-off")


def _shift(arms: dict[str, ArmOutcome], planned: tuple[str, ...] = PLANNED_BOTH):  # type: ignore[no-untyped-def]
    return shift_cause.CAUSE.decide(arms, Observations(planned=planned))


def test_context_shift_confirmed_when_turning_it_off_removes_the_runaway() -> None:
    verdict = _shift(
        {
            "baseline": _arm("baseline", 6, 6, "baseline", timeout=6),
            "context-shift-off": _arm("context-shift-off", 0, 8, "removes"),
            "max-tokens-set": _arm("max-tokens-set", 0, 8, "removes"),
        }
    )
    assert verdict.status == "confirmed"
    assert verdict.supports == ["context-shift-off", "max-tokens-set"]
    assert "--no-context-shift" in verdict.rationale


def test_context_shift_rejected_when_the_loop_survives_without_it() -> None:
    verdict = _shift(
        {
            "baseline": _arm(
                "baseline", 8, 8, "baseline", length_stop=8, repetition_to_context_end=8
            ),
            "context-shift-off": _arm(
                "context-shift-off", 8, 8, "unchanged", length_stop=8, repetition_to_context_end=8
            ),
        }
    )
    assert verdict.status == "rejected"
    assert "loop is the model's own" in verdict.rationale


def test_context_shift_rejected_when_no_failure_ran_unbounded() -> None:
    verdict = _shift(
        {"baseline": _arm("baseline", 8, 8, "baseline", length_stop=8, empty_content=8)},
        ("baseline",),
    )
    assert verdict.status == "rejected"
    assert verdict.refutes == ["baseline"]


def test_context_shift_not_confirmed_by_a_max_tokens_bound_alone() -> None:
    verdict = _shift(
        {
            "baseline": _arm("baseline", 6, 6, "baseline", timeout=6),
            "max-tokens-set": _arm("max-tokens-set", 0, 8, "removes"),
        },
        ("baseline", "max-tokens-set"),
    )
    assert verdict.status == "suspected"
    assert verdict.supports == ["max-tokens-set"]
    assert "context-shift-off" in verdict.deciding_probe


def test_context_shift_never_confirmed_without_reproduction() -> None:
    verdict = _shift(
        {
            "baseline": _arm("baseline", 0, 8, "baseline"),
            "context-shift-off": _arm("context-shift-off", 0, 8, "removes"),
        }
    )
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_context_shift_arms_planned_only_for_requests_without_max_tokens() -> None:
    off, cap = context_shift.ContextShiftOff(), context_shift.MaxTokensSet()
    on = _stack("-c", "1024", "-np", "4", "--context-shift")
    planned = off.plan(on, ASK)
    assert planned is not None and planned.config is not None
    assert list(planned.config.args) == ["-c", "1024", "-np", "4", "--no-context-shift"]
    assert off.plan(on, {**ASK, "max_tokens": 64}) is None
    assert off.plan(_stack("-c", "1024"), ASK) is None  # shift not switched on
    assert off.plan(_stack("--context-shift", "--no-context-shift"), ASK) is None
    capped = cap.plan(on, ASK)
    assert capped is not None and capped.level == "request"
    assert capped.transform(ASK)["max_tokens"] == 256  # the per-slot context
    assert "max_tokens" not in ASK
    assert cap.plan(on, {**ASK, "max_tokens": 64}) is None
    assert cap.plan(_stack("--no-context-shift"), ASK) is None
    assert cap.plan(_stack("-c", "1024"), ASK) is None  # b11434's default: shift off
    url_only = Stack(ServerConfig(None, None, (), url="http://127.0.0.1:1"))
    assert off.plan(url_only, ASK) is None
    unknown = cap.plan(url_only, ASK)
    assert unknown is not None and unknown.transform(ASK)["max_tokens"] == 4096


# ----------------------------------------------------------------- repetition-to-context-end

LOOP = " ".join(["the gulls wheel over the grey harbour and the boats slip out"] * 30)


def _exchange(content: str, finish: str, **request: Any) -> dict[str, Any]:
    return {
        "request": {**ASK, **request},
        "response": {
            "choices": [{"finish_reason": finish, "message": {"content": content}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 400},
        },
        "status": 200,
    }


def _failed(exchange: dict[str, Any]) -> list[Any]:
    return [f for f in check_repetition_to_context_end(view(exchange)) if not f.passed]


def test_repetition_to_context_end_flags_a_loop_without_max_tokens() -> None:
    findings = _failed(_exchange(LOOP, "length"))
    assert len(findings) == 1
    assert findings[0].kind == "repetition-to-context-end"
    assert findings[0].where == "$.response.choices[0].message.content"
    assert "sets no max_tokens" in findings[0].reason
    assert "repetition-to-context-end" in symptoms.failure_kinds(_exchange(LOOP, "length"))


def test_repetition_to_context_end_flags_a_loop_stopped_below_max_tokens() -> None:
    findings = _failed(_exchange(LOOP, "length", max_tokens=4096))
    assert findings and "below max_tokens 4096" in findings[0].reason


def test_repetition_stopped_by_the_clients_own_max_tokens_is_not_flagged() -> None:
    assert _failed(_exchange(LOOP, "length", max_tokens=400)) == []
    assert _failed(_exchange(LOOP, "stop")) == []  # ended by itself
    prose = " ".join(f"entry {i} names boat {i * 7} at berth {i + 3}" for i in range(80))
    assert _failed(_exchange(prose, "length")) == []  # stopped at the end, not looping


def test_context_size_reports_the_tokens_needed_against_the_slot() -> None:
    lifted = _arm("context-lifted", 2, 8, "removes")
    lifted.ended_tokens = (302, 514, 427, 377, 479, 422)
    verdict = _size(
        {"baseline": _arm("baseline", 8, 8, "baseline", length_stop=8), "context-lifted": lifted},
        {**FILL, "prompt_tokens": 40},
    )
    assert verdict.status == "confirmed"
    assert (
        "replies need 342-554 tokens (prompt 40 + answers of 302-514 tokens (median 427, "
        "6 replies that ended on their own)) vs the slot's 256"
    ) in verdict.rationale
