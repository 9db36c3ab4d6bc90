"""The copy of a reply the engine's symptom checks score (replayer.scored_copy): the
`__verbose` block cut to its scalar fields, with the same findings as the whole reply."""

from __future__ import annotations

from typing import Any

from triage.engine.replayer import classify_reply, scored_copy

REQUEST = {"messages": [{"role": "user", "content": "plan the trip"}], "max_tokens": 64}


def _reply(**choice: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": choice.pop("content", "")}
    message.update(choice.pop("message", {}))
    return {
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        # No usage and no timings: the token count is only in __verbose.
        "__verbose": {
            "content": "<think>" + "step " * 400,
            "prompt": "<start_of_turn>user\nplan the trip " + "x" * 2000,
            "tokens": list(range(64)),
            "generation_settings": {"n_predict": 64, "samplers": ["top_k", "temp"]},
            "timings": {"predicted_n": 64},
            "tokens_predicted": 64,
            "tokens_evaluated": 12,
            "truncated": False,
            "stop_type": "limit",
            "stopping_word": "",
            "has_new_line": True,
        },
    }


def test_the_scored_copy_keeps_the_scalar_fields_and_drops_the_bulk() -> None:
    reply = _reply(content="ok")
    scored = scored_copy(reply)
    assert scored["__verbose"] == {
        "tokens_predicted": 64,
        "tokens_evaluated": 12,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "has_new_line": True,
    }
    assert "prompt" in reply["__verbose"]  # the reply itself is left as it was
    assert scored["choices"] is reply["choices"]
    assert scored_copy({"choices": []}) == {"choices": []}
    assert scored_copy("not json") == "not json"


def test_a_budget_spent_in_reasoning_counted_from_verbose_is_still_found() -> None:
    # finish_reason "stop", but __verbose says all 64 tokens of max_tokens were used, nearly
    # all of them reasoning: the check needs __verbose.tokens_predicted to see the limit.
    reply = _reply(content="", message={"reasoning_content": "step " * 400})
    full = classify_reply(REQUEST, 200, reply, 0.1)
    assert "reasoning-exhausted-budget" in full[1]
    assert classify_reply(REQUEST, 200, scored_copy(reply), 0.1) == full
    passing = _reply(content="Day 1: the museum. Day 2: the coast.")
    assert classify_reply(REQUEST, 200, scored_copy(passing), 0.1) == classify_reply(
        REQUEST, 200, passing, 0.1
    )
