"""unstable-prefix: a conversation's turns that share no prompt beginning (a timestamp first in
the system prompt) are a finding, with the shared prefix in characters and where the prompts
first differ; a stable prefix, short prompts and the cache turned off are not. One exchange
alone is a finding when its timings say a long continuation took nothing from the cache."""

from __future__ import annotations

from typing import Any

from triage.capture import exchange_from_http
from triage.checks.prefix import sequence_findings, shared_prefix, turn_steps
from triage.symptoms import classify

POLICY = "You are a helpful assistant. Follow the house rules carefully. " * 30


def _conversation(system: Any, turns: int = 4) -> list[dict[str, Any]]:
    exchanges, messages = [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: topic {turn}?"})
        request = {"messages": [{"role": "system", "content": system(turn)}, *messages]}
        exchanges.append({"request": request, "response": {"timings": {"cache_n": 40 + turn}}})
        messages = [*messages, {"role": "assistant", "content": f"About topic {turn}."}]
    return exchanges


def _stamp(turn: int) -> str:
    return f"Current time: 2026-12-01T17:0{turn}:00Z. "


def test_a_timestamp_first_in_the_system_prompt_is_a_finding_at_the_changed_character() -> None:
    findings = sequence_findings(_conversation(lambda turn: _stamp(turn) + POLICY))
    assert [f.passed for f in findings] == [False, False, False]
    first = findings[0]
    assert first.kind == "unstable-prefix"
    assert first.where == "$[1].request.messages[0].content"
    assert first.offset == len("Current time: 2026-12-01T17:0")
    assert f"turn 1 shares {len('<system>') + first.offset} of the" in first.reason
    assert "timings.cache_n was 41" in first.reason
    assert first.score > 0.9


def test_a_stable_prefix_or_the_timestamp_at_the_end_is_not_a_finding() -> None:
    assert sequence_findings(_conversation(lambda turn: POLICY)) == []
    stable_end = _conversation(lambda turn: POLICY + _stamp(turn))
    assert sequence_findings(stable_end) == []
    steps = turn_steps(stable_end)
    assert [s.shared_chars for s in steps] == [len("<system>") + len(POLICY) + 29] * 3


def test_short_prompts_are_not_findings_and_the_sequence_is_bounded() -> None:
    assert sequence_findings(_conversation(lambda turn: _stamp(turn) + "Be brief.")) == []
    assert sequence_findings([]) == [] and sequence_findings([{"request": "junk"}]) == []
    assert shared_prefix("abcdef", "abcxyz") == 3


def test_tools_and_completion_prompts_are_rendered_too() -> None:
    tools = [{"type": "function", "function": {"name": f"f{turn}"}} for turn in range(2)]
    exchanges = [
        {"request": {"tools": [tools[turn]], "messages": [{"role": "user", "content": POLICY}]}}
        for turn in range(2)
    ]
    (finding,) = sequence_findings(exchanges)
    assert finding.where == "$[1].request.tools"
    prompts = [{"request": {"prompt": f"{turn} {POLICY}"}} for turn in range(2)]
    assert sequence_findings(prompts)[0].where == "$[1].request.prompt"


def _reply(request: dict[str, Any], prompt_n: int, cache_n: int) -> list[Any]:
    body = {
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "timings": {"prompt_n": prompt_n, "cache_n": cache_n, "prompt_ms": 215.5},
    }
    return [f for f in classify(exchange_from_http(request, body)) if f.kind == "unstable-prefix"]


CONTINUATION = {
    "messages": [
        {"role": "system", "content": "x"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
}


def test_one_continuation_that_took_nothing_from_the_cache_is_a_finding() -> None:
    (finding,) = _reply(CONTINUATION, 1966, 44)
    assert not finding.passed and finding.where == "$.response.timings.cache_n"
    assert "took 44 of its 2010 prompt tokens" in finding.reason
    assert "(216 ms)" in finding.reason or "(215 ms)" in finding.reason


def test_reuse_a_first_turn_a_short_prompt_or_the_cache_off_are_not_findings() -> None:
    assert _reply(CONTINUATION, 74, 1894)[0].passed
    assert _reply(CONTINUATION, 100, 0)[0].passed
    assert _reply({"messages": [{"role": "user", "content": "a"}]}, 1820, 0)[0].passed
    assert _reply({**CONTINUATION, "cache_prompt": False}, 1966, 0)[0].passed
