"""prompt-cache (cause 21): the value a client re-renders every turn is found in the first
message; the prompt-cache-turns observation replays the conversation turn by turn on one slot
with the cache on, that value re-rendered vs held, and reads cache_n back; the cause is
confirmed only when the captured turn reused nothing, the re-rendered turns reproduce it and
holding the value removes it -- pure, the server a mock transport that keeps a real prefix
cache (the longest common prefix with the slot's last prompt)."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import httpx
import pytest

from triage.causes import ArmOutcome, Observations
from triage.engine.arms import cache_as_client as cache_arm
from triage.engine.arms import prompt_cache as arm
from triage.engine.arms import slot_replay
from triage.engine.causes.prompt_cache import CAUSE
from triage.probes import ObserveContext

POLICY = "Answer briefly and politely. " * 40


def _conversation(system: str, turns: int = 4) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}?"})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": "Answer."})
    return {"messages": messages, "temperature": 0.0}


STAMPED = _conversation("Current time: 2026-12-01T17:03:07Z. " + POLICY)


# ------------------------------------------------------------------ the volatile value


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("Now: 2026-12-01T17:03:07Z. Be brief.", "timestamp", "2026-12-01T17:03:07Z"),
        ("Date 2026-12-01, be brief.", "date", "2026-12-01"),
        ("It is 9:41 AM. Be brief.", "time", "9:41 AM"),
        ("Request 123e4567-e89b-12d3-a456-426614174000 follows.", "uuid", None),
        ("ts=1764608587 then rules", "epoch", "1764608587"),
    ],
)
def test_a_value_a_client_renders_every_turn_is_found(
    text: str, kind: str, value: str | None
) -> None:
    found = arm.volatile_value({"messages": [{"role": "system", "content": text}]})
    assert found is not None and found.kind == kind and found.where == "$.messages[0].content"
    assert text[found.offset : found.offset + len(found.text)] == found.text
    if value is not None:
        assert found.text == value


def test_no_volatile_value_in_a_plain_policy() -> None:
    assert arm.volatile_value(_conversation(POLICY)) is None
    assert arm.volatile_value({"messages": []}) is None


def test_re_rendering_keeps_the_shape_and_differs_every_turn() -> None:
    found = arm.volatile_value(STAMPED)
    assert found is not None
    values = set()
    for turn in range(1, 6):
        content = arm.varied(STAMPED, found, turn)["messages"][0]["content"]
        assert len(content) == len(STAMPED["messages"][0]["content"])
        assert content.endswith(POLICY)
        values.add(content[found.offset : found.offset + len(found.text)])
    assert len(values) == 5 and found.text not in values


def test_turns_are_the_conversation_up_to_each_user_message_on_one_slot() -> None:
    turns = arm.turn_requests(STAMPED)
    assert [len(t["messages"]) for t in turns] == [2, 4, 6, 8]
    assert all(t["cache_prompt"] is True and t["id_slot"] == 0 for t in turns)
    assert all(t["max_tokens"] == 1 for t in turns)
    assert turns[-1]["messages"] == STAMPED["messages"]


# ----------------------------------------------------------------- the observation hook


def _prefix(a: str, b: str) -> int:
    index = 0
    while index < min(len(a), len(b)) and a[index] == b[index]:
        index += 1
    return index


def _transport(sent: list[dict[str, Any]]) -> httpx.MockTransport:
    """One slot with llama-server's reuse rule: the cache gives back the longest common
    prefix of the new prompt (one token a character) with the slot's last prompt."""
    slot = {"prompt": ""}

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        prompt = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"])
        cached = _prefix(prompt, slot["prompt"]) if body.get("cache_prompt") else 0
        slot["prompt"] = prompt
        timings = {
            "cache_n": cached,
            "prompt_n": len(prompt) - cached,
            "prompt_ms": (len(prompt) - cached) / 10,
        }
        message = {"role": "assistant", "content": "A"}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        return httpx.Response(200, json={"choices": [choice], "timings": timings})

    return httpx.MockTransport(handle)


class _Server:
    base_url, api_key = "http://server:1", None


def _observe(
    monkeypatch: pytest.MonkeyPatch, request: dict[str, Any], exchange: dict[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        slot_replay,
        "LlamaClient",
        functools.partial(slot_replay.LlamaClient, transport=_transport(sent)),
    )
    ctx = ObserveContext(_Server(), _Server(), request, 1, 30.0, exchange=exchange)
    return asyncio.run(arm.observe(ctx)), sent


def _captured(cache_n: int, prompt_n: int) -> dict[str, Any]:
    timings = {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": 150.0}
    return {"request": STAMPED, "response": {"choices": [], "timings": timings}}


def _decide(facts: dict[str, Any], baseline: ArmOutcome | None = None) -> Any:
    base = baseline or ArmOutcome("baseline", 16, 0, "no-baseline-failure")
    return CAUSE.decide({"baseline": base}, Observations(facts={arm.ARM: facts}))


def test_a_timestamp_first_confirms_it_with_k_of_n_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts, sent = _observe(monkeypatch, STAMPED, _captured(14, 1400))
    replay = facts["replay"]
    assert replay["as_client"]["reuse_nothing"] == replay["as_client"]["n"] >= arm.MIN_PAIRS
    assert replay["held"]["reuse_nothing"] == 0 and replay["held"]["n"] >= arm.MIN_PAIRS
    assert replay["held"]["median_cache_n"] > 1000 > 100 > replay["as_client"]["median_cache_n"]
    assert all(body["id_slot"] == 0 and body["cache_prompt"] for body in sent)
    verdict = _decide(facts)
    assert verdict.status == "confirmed" and verdict.deciding_probe == arm.ARM
    assert "14 of its 1414 prompt tokens" in verdict.rationale
    assert "timestamp '2026-12-01T17:03:07Z'" in verdict.rationale


def test_a_stable_prefix_sends_nothing_and_is_not_confirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts, sent = _observe(monkeypatch, _conversation(POLICY), _captured(14, 1400))
    assert sent == [] and facts["volatile"] is None
    verdict = _decide(facts)
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_a_value_at_the_end_of_a_short_history_does_not_reproduce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    late = _conversation(POLICY + " Generated 2026-12-01T17:03:07Z.")
    facts, _ = _observe(monkeypatch, late, _captured(14, 1400))
    assert facts["replay"]["as_client"]["reuse_nothing"] == 0  # the policy before it is reused
    verdict = _decide(facts)
    assert verdict.status == "suspected" and "not what changes the prefix" in verdict.rationale


def test_a_captured_turn_that_reused_its_prefix_rejects_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts, _ = _observe(monkeypatch, STAMPED, _captured(1300, 100))
    verdict = _decide(facts)
    assert verdict.status == "rejected" and "its prefix was reused" in verdict.rationale


def test_single_requests_and_cache_off_send_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    single = {"messages": [{"role": "user", "content": "Now: 2026-12-01T17:03:07Z"}]}
    for request in (single, {**STAMPED, "cache_prompt": False}):
        facts, sent = _observe(monkeypatch, request, None)
        assert sent == []
    off = _decide(facts)
    assert off.status == "rejected" and "turned the prompt cache off" in off.rationale


def test_a_failure_the_cache_off_baseline_reproduces_rejects_it() -> None:
    facts = {"name": arm.ARM, "continuation": False, "cache_off": False, "captured": None}
    verdict = _decide(facts, ArmOutcome("baseline", 8, 8, "reproduces"))
    assert verdict.status == "rejected" and "cache_prompt: false" in verdict.rationale
    untested = _decide(facts)
    assert untested.status == "suspected" and untested.basis == "untested"


def test_held_turns_that_still_reuse_nothing_reject_it() -> None:
    way = {"n": 8, "reuse_nothing": 8, "median_cache_n": 40, "median_prompt_ms": 100.0}
    facts = {
        "name": arm.ARM,
        "continuation": True,
        "cache_off": False,
        "captured": {"cache_n": 10, "prompt_n": 1400, "prompt_ms": 100.0},
        "volatile": {
            "kind": "time",
            "text": "17:03",
            "where": "$.messages[0].content",
            "offset": 0,
        },
        "replay": {"as_client": way, "held": way, "decision": "unchanged", "p_value": 1.0},
    }
    verdict = _decide(facts)
    assert verdict.status == "rejected" and "even with the value held" in verdict.rationale


def test_no_observation_is_untested_unless_the_cache_off_baseline_reproduces() -> None:
    verdict = CAUSE.decide({}, Observations())
    assert verdict.status == "suspected" and verdict.basis == "untested"
    # An embeddings request (no chat observation) whose cache-off baseline fails 8/8.
    reproduced = CAUSE.decide({"baseline": ArmOutcome("baseline", 8, 8, "")}, Observations())
    assert reproduced.status == "rejected" and reproduced.deciding_probe == "baseline"


# ---------------------------------------------------------------- cache-as-client (restore)


SINGLE: dict[str, Any] = {"messages": [{"role": "user", "content": "Which city?"}]}
EMPTY = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}]}


def _restore_transport(buggy: bool, sent: list[dict[str, Any]]) -> httpx.MockTransport:
    """One slot; with `buggy`, a reply whose prompt was restored from the cache comes back
    empty (a restore bug), any other reply answers."""
    slot = {"prompt": ""}

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        prompt = json.dumps(body["messages"])
        restored = bool(body.get("cache_prompt")) and prompt == slot["prompt"]
        slot["prompt"] = prompt
        content = "" if buggy and restored else "Paris."
        message = {"role": "assistant", "content": content}
        timings = {"cache_n": len(prompt) - 1 if restored else 0, "prompt_n": 1}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "timings": timings})

    return httpx.MockTransport(handle)


def _observe_restore(
    monkeypatch: pytest.MonkeyPatch, buggy: bool, exchange: dict[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    transport = _restore_transport(buggy, sent)
    monkeypatch.setattr(
        slot_replay, "LlamaClient", functools.partial(slot_replay.LlamaClient, transport=transport)
    )
    ctx = ObserveContext(_Server(), _Server(), SINGLE, 1, 30.0, exchange=exchange)
    return asyncio.run(cache_arm.observe(ctx)), sent


def _decide_single(cache_facts: dict[str, Any], baseline: ArmOutcome) -> Any:
    facts = {
        arm.ARM: {"name": arm.ARM, "continuation": False, "cache_off": False, "captured": None},
        cache_arm.ARM: cache_facts,
    }
    return CAUSE.decide({"baseline": baseline}, Observations(facts=facts))


def test_a_restore_bug_is_confirmed_by_cache_on_against_the_cache_off_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured = {"request": SINGLE, "response": EMPTY, "status": 200}
    facts, sent = _observe_restore(monkeypatch, True, captured)
    assert facts["ran"] and (facts["failures"], facts["n"]) == (8, 8)
    assert all(body["cache_prompt"] is True and body["id_slot"] == 0 for body in sent)
    verdict = _decide_single(facts, ArmOutcome("baseline", 16, 0, "no-baseline-failure"))
    assert verdict.status == "confirmed" and verdict.deciding_probe == cache_arm.ARM
    assert "8/8" in verdict.rationale and "0/16" in verdict.rationale


def test_a_cache_that_changes_nothing_stops_at_the_first_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured = {"request": SINGLE, "response": EMPTY, "status": 200}
    facts, _ = _observe_restore(monkeypatch, False, captured)
    assert (facts["failures"], facts["n"]) == (0, cache_arm.FIRST_LOOK)
    verdict = _decide_single(facts, ArmOutcome("baseline", 16, 0, "no-baseline-failure"))
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "0/4" in verdict.rationale


def test_cache_as_client_sends_nothing_without_a_failing_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answered = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}}]}
    for exchange in (None, {"request": SINGLE, "response": answered, "status": 200}):
        facts, sent = _observe_restore(monkeypatch, True, exchange)
        assert sent == [] and facts["ran"] is False
