"""Model loops on real text (issue 23): the repetition-loop finding on natural language (what
SmolLM2-135M wrote, measured), and the model-loop cause decided by the anti-repetition arm."""

from __future__ import annotations

from typing import Any

from triage.capture import exchange_from_http
from triage.causes import ArmOutcome, Observations, decide
from triage.checks.loops import loop_share
from triage.engine.arms.anti_repetition import AntiRepetition, with_anti_repetition
from triage.stackfile import ServerConfig, Stack
from triage.symptoms import failure_kinds

# Measured: SmolLM2-135M-Instruct, temperature 0, "Write a long poem about the sea." and
# "List the steps to bake bread." on -c 1024 (both finish length at the context end).
POEM = "In the depths of the ocean, where shadows play,\n" + "Abe aria, aria of the sea,\n" * 60
BREAD = "1. Preheat your oven to 425°F (220°C)\n" + "".join(
    f"{i}. Let the bread rest for 1 hour before it is ready to be baked.\n" for i in range(2, 52)
)
# Measured: SmolLM2-135M, the bicycle question at temperature 0.8, seed 1000 -- a whole
# answer that ended on its own (finish stop, 377 tokens). This model repeats itself even
# when it does not loop ("This is a mechanical device that..."): 40% of its 5-grams.
ANSWER = (
    "A bicycle gear system is a complex mechanical system that consists of multiple c"
    "omponents designed to optimize transportation. The system operates by using vari"
    "ous techniques to improve the efficiency of transportation and reducing costs.\n\n"
    "The bicycle gear system operates on three primary components:\n\n1. Bike Brake (Br"
    "imination): This is a mechanical device that uses hydraulic pressure to transfer"
    " the weight of a bicycle onto a counterweight that can be adjusted.\n\n2. Bicycle "
    "Gear (Beads): This is a mechanical device that is used to reduce the weight of t"
    "he bicycle. It is a device that is used to attach a gear system to a wheel.\n\n3. "
    "Bike Brake: This is a mechanical device that is used to transfer the weight of a"
    " bicycle onto a counterweight that can be adjusted.\n\nThe bicycle gear system ope"
    "rates on the principle of:\n\n- Bike Brake: This is a mechanical device that uses "
    "hydraulic pressure to transfer the weight of a bicycle onto a counterweight that"
    " can be adjusted.\n- Bike Brake: This is a mechanical device that is used to redu"
    "ce the weight of the bicycle.\n- Bike Brake: This is a mechanical device that is "
    "used to transfer the weight of a bicycle onto a counterweight that can be adjust"
    "ed.\n\nThe bicycle gear system is designed to optimize the weight of the bicycle, "
    "reducing its overall weight and improving its efficiency. This is achieved throu"
    "gh various techniques, including:\n\n- Bike Brace: This is a mechanical device tha"
    "t uses hydraulic pressure to transfer the weight of the bicycle onto a counterwe"
    "ight that can be adjusted.\n- Bike Brake: This is a mechanical device that is use"
    "d to reduce the weight of the bicycle.\n\nThe bicycle gear system is designed to r"
    "educe the weight of the bicycle by using various techniques to reduce its weight"
    " and improve its efficiency."
)
REQUEST = {"messages": [{"role": "user", "content": "Write a long poem about the sea."}]}


def _reply(content: str, finish: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def _kinds(content: str, finish: str, request: dict[str, Any] = REQUEST) -> set[str]:
    return failure_kinds(exchange_from_http(request, _reply(content, finish), status=200))


def test_natural_language_loops_cut_by_a_limit_are_found() -> None:
    assert loop_share(POEM) > 0.9
    assert loop_share(BREAD) > 0.9  # the counter does not hide the loop
    assert "repetition-loop" in _kinds(POEM, "length")
    # Cut by the client's own max_tokens: still a loop (the context-end check stays quiet).
    limited = {**REQUEST, "max_tokens": 200}
    assert "repetition-loop" in _kinds(BREAD, "length", limited)
    assert "repetition-to-context-end" not in _kinds(BREAD, "length", limited)


def test_an_answer_or_a_repeated_phrase_that_ends_on_its_own_is_not_a_loop() -> None:
    assert loop_share(ANSWER) < 0.5
    assert "repetition-loop" not in _kinds(ANSWER, "length")
    assert "repetition-loop" not in _kinds(POEM, "stop")


def test_the_arm_adds_dry_and_a_repeat_penalty_unless_the_request_has_them() -> None:
    stack = Stack(ServerConfig())
    planned = AntiRepetition().plan(stack, REQUEST)
    assert planned is not None
    assert planned.decides == ("model-loop", "reasoning-exhausts-budget")
    body = with_anti_repetition(REQUEST)
    assert body["dry_multiplier"] == 0.8 and body["repeat_penalty"] == 1.1
    assert "dry_multiplier" not in REQUEST
    assert AntiRepetition().plan(stack, {**REQUEST, "dry_multiplier": 0.5}) is None


def _arm(name: str, k: int, n: int, decision: str, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001, kind_counts=counts)


def _model_loop(arms: dict[str, ArmOutcome]) -> Any:
    obs = Observations(planned=tuple(arms))
    return {v.cause: v for v in decide(arms, obs)}["model-loop"]


def test_a_loop_that_penalties_break_is_model_loop() -> None:
    base = _arm("baseline", 8, 8, "baseline", length_stop=8, repetition_loop=8)
    verdict = _model_loop({"baseline": base, "anti-repetition": _arm("a", 0, 8, "removes")})
    assert verdict.status == "confirmed" and "0/8" in verdict.rationale
    same = _arm("anti-repetition", 4, 4, "unchanged", length_stop=4, repetition_loop=4)
    assert _model_loop({"baseline": base, "anti-repetition": same}).status == "rejected"


def test_a_failure_that_is_not_a_loop_is_not_model_loop() -> None:
    base = _arm("baseline", 8, 8, "baseline", length_stop=8)  # cut answers, no repetition
    verdict = _model_loop({"baseline": base, "anti-repetition": _arm("a", 8, 8, "unchanged")})
    assert verdict.status == "rejected" and "not a loop" in verdict.rationale


# A looping THOUGHT that thinking-off "fixes" (issue 23): the thought channel removed takes
# the loop with it, which says nothing about the budget. The anti-repetition arm tells them
# apart; the seed drill's thought (gemma4-thinking-budget at temperature 0) resists DRY +
# repeat_penalty (measured on b11434: 800/800 tokens of thought either way), so it stays the
# budget cause there.
def _thought_loop(anti: ArmOutcome | None) -> dict[str, Any]:
    base = _arm("baseline", 8, 8, "baseline", length_stop=8, runaway_reasoning=8,
                reasoning_exhausted_budget=8, empty_content=8)  # fmt: skip
    arms = {"baseline": base, "thinking-off": _arm("thinking-off", 0, 8, "removes")}
    if anti is not None:
        arms["anti-repetition"] = anti
    obs = Observations(thinking_on_by_default=True, planned=tuple(arms))
    return {v.cause: v for v in decide(arms, obs)}


def test_a_looping_thought_that_penalties_end_is_model_loop_not_the_budget() -> None:
    verdicts = _thought_loop(_arm("anti-repetition", 0, 8, "removes"))
    budget = verdicts["reasoning-exhausts-budget"]
    assert budget.status == "rejected" and budget.deciding_probe == "anti-repetition"
    assert "thoughts loop" in budget.rationale and "not a budget too small" in budget.rationale
    assert verdicts["model-loop"].status == "confirmed"


def test_a_looping_thought_is_not_the_budget_before_the_penalty_arm_decides() -> None:
    verdicts = _thought_loop(_arm("anti-repetition", 2, 4, "undecided", runaway_reasoning=2))
    assert verdicts["reasoning-exhausts-budget"].status == "suspected"
    assert "anti-repetition" in verdicts["reasoning-exhausts-budget"].deciding_probe


def test_a_looping_thought_that_resists_penalties_eats_any_budget() -> None:
    resists = _arm("anti-repetition", 4, 4, "unchanged", length_stop=4, runaway_reasoning=4)
    verdicts = _thought_loop(resists)
    assert verdicts["reasoning-exhausts-budget"].status == "confirmed"
    assert verdicts["model-loop"].status == "rejected"
    # A request that already penalises repetition plans no anti-repetition arm: the same.
    assert _thought_loop(None)["reasoning-exhausts-budget"].status == "confirmed"
