"""Rules from probe outcomes to cause statuses."""

from __future__ import annotations

from triage.causes import ArmOutcome, Observations, decide


def _arm(name: str, k: int, n: int, decision: str, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001, kind_counts=counts)


def _by_id(verdicts):  # type: ignore[no-untyped-def]
    return {v.cause: v for v in verdicts}


def test_thinking_budget_shape() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8, empty_content=8),
        "thinking-off": _arm("thinking-off", 0, 8, "removes"),
        "reasoning-budget": _arm("reasoning-budget", 0, 8, "removes"),
        "token-limit-lifted": _arm("token-limit-lifted", 0, 8, "removes"),
        "spec-off": _arm("spec-off", 4, 4, "unchanged", length_stop=4),
        "alt-weights": _arm("alt-weights", 4, 4, "unchanged", length_stop=4),
    }
    obs = Observations(
        thinking_on_by_default=True,
        speculative_enabled=True,
        divergence={"seeds": 4, "diverged": 1, "first_positions": [37]},
        has_alt_weights=True,
    )
    verdicts = _by_id(decide(arms, obs))
    assert verdicts["reasoning-exhausts-budget"].status == "confirmed"
    assert verdicts["token-limit"].status == "rejected"  # thinking off already fits
    assert verdicts["quantized-weights"].status == "rejected"
    spec = verdicts["speculative-decoding"]
    assert spec.status == "rejected"
    assert "diverged in 1/4" in spec.rationale and "distribution" in spec.rationale
    assert verdicts["server-build"].status == "suspected"
    assert "alternate" in verdicts["server-build"].undecided
    assert verdicts["output-parsing"].status == "rejected"


def test_diverging_streams_alone_never_confirm_speculative_decoding() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 40, "baseline", length_stop=8),
        "spec-off": _arm("spec-off", 7, 40, "undecided", length_stop=7),
    }
    obs = Observations(
        speculative_enabled=True, divergence={"seeds": 4, "diverged": 4, "first_positions": [3]}
    )
    assert _by_id(decide(arms, obs))["speculative-decoding"].status == "suspected"


def test_changed_rate_without_spec_confirms_it() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 16, "baseline", tool_args_invalid_json=8),
        "spec-off": _arm("spec-off", 0, 16, "removes"),
    }
    obs = Observations(speculative_enabled=True)
    assert _by_id(decide(arms, obs))["speculative-decoding"].status == "confirmed"


def test_alternate_weights_with_a_different_template_are_confounded() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
        "alt-weights": _arm("alt-weights", 0, 8, "removes"),
    }
    obs = Observations(has_alt_weights=True, confounders=["the thinking default"])
    verdict = _by_id(decide(arms, obs))["quantized-weights"]
    assert verdict.status == "suspected"
    assert "confounded" in verdict.rationale


def test_tool_call_in_thought_is_output_parsing_not_budget() -> None:
    arms = {
        "baseline": _arm("baseline", 6, 16, "baseline", tool_markup_leaked=6, empty_content=6),
        "thinking-off": _arm("thinking-off", 0, 16, "removes"),
    }
    verdicts = _by_id(decide(arms, Observations(thinking_on_by_default=True)))
    assert verdicts["output-parsing"].status == "confirmed"
    assert verdicts["reasoning-exhausts-budget"].status == "rejected"
    assert verdicts["token-limit"].status == "rejected"


def test_answer_too_long_is_token_limit() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", length_stop=8),
        "thinking-off": _arm("thinking-off", 8, 8, "unchanged", length_stop=8),
        "reasoning-budget": _arm("reasoning-budget", 8, 8, "unchanged", length_stop=8),
        "token-limit-lifted": _arm("token-limit-lifted", 0, 8, "removes"),
    }
    verdicts = _by_id(decide(arms, Observations(thinking_on_by_default=False)))
    assert verdicts["token-limit"].status == "confirmed"
    assert verdicts["reasoning-exhausts-budget"].status == "rejected"


def test_nothing_is_confirmed_when_the_baseline_does_not_reproduce() -> None:
    arms = {
        "baseline": _arm("baseline", 0, 16, "baseline"),
        "thinking-off": _arm("thinking-off", 0, 16, "no-baseline-failure"),
    }
    verdicts = decide(arms, Observations(speculative_enabled=True))
    assert all(v.status != "confirmed" for v in verdicts)
    assert "did not reproduce" in _by_id(verdicts)["reasoning-exhausts-budget"].rationale
