"""token-limit decided by lifting the limit to the slot's context (issue 23): the arm's
request, when it is planned, and the rule's verdicts with the measured natural length."""

from __future__ import annotations

from triage.causes import ArmOutcome, Observations, decide
from triage.engine.arms.request import LIFTED, TokenLimitLifted
from triage.engine.scheduler import ArmState
from triage.stackfile import ServerConfig, Stack

BICYCLE = {
    "messages": [{"role": "user", "content": "Explain in detail how a bicycle gear system works."}],
    "max_tokens": 24,
    "temperature": 0.8,
}


def _stack(*args: str) -> Stack:
    return Stack(ServerConfig(None, None, tuple(args), url=None))


def test_the_limit_is_lifted_to_the_slots_context_not_multiplied() -> None:
    planned = TokenLimitLifted().plan(_stack("-c", "2048", "-np", "1"), BICYCLE)
    assert planned is not None and planned.decides == ("token-limit",)
    body = planned.transform(BICYCLE)
    assert body["max_tokens"] == 2048  # the slot bounds the reply, not 4 x 24
    assert BICYCLE["max_tokens"] == 24  # the captured request is not touched
    # Every limit field goes: n_predict / max_completion_tokens would still cut it.
    body = planned.transform({**BICYCLE, "n_predict": 24, "max_completion_tokens": 24})
    assert body["max_tokens"] == 2048 and "n_predict" not in body
    assert "max_completion_tokens" not in body
    # Four slots of a 2048 context: 512 tokens per slot.
    four = TokenLimitLifted().plan(_stack("-c", "2048", "-np", "4"), BICYCLE)
    assert four is not None and four.transform(BICYCLE)["max_tokens"] == 512


def test_not_planned_when_lifting_cannot_change_anything() -> None:
    stack = _stack("-c", "2048", "-np", "1")
    no_limit = {k: v for k, v in BICYCLE.items() if k != "max_tokens"}
    assert TokenLimitLifted().plan(stack, no_limit) is None
    assert TokenLimitLifted().plan(stack, {**BICYCLE, "max_tokens": 4096}) is None


def test_a_running_server_by_url_gets_the_limit_removed() -> None:
    stack = Stack(ServerConfig(url="http://127.0.0.1:8080"))
    planned = TokenLimitLifted().plan(stack, BICYCLE)
    assert planned is not None
    assert "max_tokens" not in planned.transform(BICYCLE)


def _arm(name: str, k: int, n: int, decision: str, ended: tuple[int, ...] = (), **kinds: int):  # type: ignore[no-untyped-def]
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(
        name,
        n=n,
        failures=k,
        decision=decision,
        p_value=0.001,
        kind_counts=counts,
        ended_tokens=ended,
    )


def _token_limit(arms: dict[str, ArmOutcome], obs: Observations):  # type: ignore[no-untyped-def]
    return {v.cause: v for v in decide(arms, obs)}["token-limit"]


LIMITS = {"request-limits": {"name": "request-limits", "max_tokens": 24, "n_ctx_slot": 2048}}


def test_replies_that_end_once_lifted_confirm_it_with_their_natural_length() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
        LIFTED: _arm(LIFTED, 0, 8, "removes", ended=(240, 520, 380, 300, 410, 290, 350, 460)),
    }
    verdict = _token_limit(arms, Observations(thinking_on_by_default=False, facts=LIMITS))
    assert verdict.status == "confirmed"
    assert "replies need 240-520 tokens" in verdict.rationale
    assert "max_tokens is 24" in verdict.rationale
    assert "0/8" in verdict.rationale and verdict.deciding_probe == LIFTED


def test_replies_that_still_fail_once_lifted_reject_it() -> None:
    """A loop runs to the slot's end whatever the limit: not a token-limit problem."""
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
        LIFTED: _arm(LIFTED, 8, 8, "unchanged", length_stop=8),
    }
    verdict = _token_limit(arms, Observations(thinking_on_by_default=False))
    assert verdict.status == "rejected"
    assert "do not end on their own" in verdict.rationale


def test_thinking_on_needs_thinking_off_to_still_stop_on_length() -> None:
    base = _arm("baseline", 8, 8, "baseline", length_stop=8)
    lifted = _arm(LIFTED, 0, 8, "removes", ended=(900,))
    undecided = {
        "baseline": base,
        LIFTED: lifted,
        "thinking-off": _arm("thinking-off", 2, 4, "undecided", length_stop=2),
    }
    assert _token_limit(undecided, Observations(thinking_on_by_default=True)).status == "suspected"
    still = {**undecided, "thinking-off": _arm("thinking-off", 8, 8, "unchanged", length_stop=8)}
    assert _token_limit(still, Observations(thinking_on_by_default=True)).status == "confirmed"
    fits = {**undecided, "thinking-off": _arm("thinking-off", 0, 8, "removes")}
    assert _token_limit(fits, Observations(thinking_on_by_default=True)).status == "rejected"


class _Reply:
    def __init__(self, index: int, finish: str, tokens: int, failed: bool) -> None:
        self.index, self.finish_reason, self.failed = index, finish, failed
        self.timings = {"predicted_n": tokens}
        self.error, self.kinds, self.raw_misplaced = "", [], False


def test_only_replies_that_ended_on_their_own_count_as_natural_length() -> None:
    arm = ArmState(LIFTED, "", "request", "g", ("token-limit",))
    arm.replies = [_Reply(0, "stop", 300, False), _Reply(1, "length", 2040, True)]
    assert arm.outcome().ended_tokens == (300,)


def test_a_limit_past_the_slot_is_ruled_out_without_replays() -> None:
    arms = {"baseline": _arm("baseline", 8, 8, "baseline", length_stop=8)}
    limits = {"request-limits": {"name": "request-limits", "max_tokens": 1024, "n_ctx_slot": 256}}
    verdict = _token_limit(arms, Observations(facts=limits))
    assert verdict.status == "rejected" and "reaches past the slot's context" in verdict.rationale
    # Unknown slot (no /props): not testable, never rejected on a guess.
    assert _token_limit(arms, Observations()).status == "suspected"
