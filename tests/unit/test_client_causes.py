"""client-handling and conversation-shape (issue 13): the rules, the client-view capture
format and observation, and the history normalisation -- pure, no server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from triage import probes
from triage.capture import CaptureError, load_file
from triage.capture.model import validate_exchange
from triage.causes import ArmOutcome, Observations
from triage.drills.client import client_view_capture, conversation_request
from triage.engine.arms import client_view, history
from triage.engine.causes import client_handling, conversation_shape
from triage.stackfile import ServerConfig, Stack

FIXTURE = Path(__file__).parents[1] / "fixtures" / "captures" / "client" / "content-only.json"


def _arm(name: str, k: int, n: int, decision: str) -> ArmOutcome:
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001)


def _obs(facts: dict[str, Any], planned: tuple[str, ...] = ()) -> Observations:
    return Observations(facts={facts["name"]: facts}, planned=planned)


# --------------------------------------------------------------------- client-view capture


def test_client_view_capture_keeps_both_views() -> None:
    (exchange,) = load_file(FIXTURE)
    assert exchange.source_format == "client-view" and exchange.stream
    client = exchange.response["choices"][0]["message"]  # type: ignore[index]
    assert client["content"] == "" and "tool_calls" not in client
    wire = exchange.wire_response["choices"][0]["message"]  # type: ignore[index]
    assert wire["tool_calls"][0]["function"]["name"] == "get_weather"
    assert validate_exchange(exchange.to_dict()) == []


def test_other_captures_store_no_wire_response_key() -> None:
    (exchange,) = load_file(FIXTURE)
    exchange.wire_response = None
    assert "wire_response" not in exchange.to_dict()


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d.pop("stream"), "$.stream"),
        (lambda d: d.update(stream="not sse at all"), "$.stream"),
        (lambda d: d["client_view"].update(content=3), "$.client_view.content"),
        (lambda d: d["client_view"].update(colour="red"), "$.client_view"),
        (lambda d: d.update(request=[1]), "$.request"),
    ],
)
def test_bad_client_view_capture_names_the_field(tmp_path: Path, edit: Any, where: str) -> None:
    data = json.loads(FIXTURE.read_text())
    edit(data)
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CaptureError) as caught:
        load_file(path, format="client-view")
    assert where in str(caught.value) and "capture.json" in str(caught.value)


def test_drill_capture_helper_builds_a_content_only_view() -> None:
    data = json.loads(FIXTURE.read_text())
    rebuilt = client_view_capture(data["request"], data["stream"])
    assert rebuilt["client_view"] == {"content": ""}


# --------------------------------------------------------------- client-view observation


def test_compare_views_on_the_recorded_capture() -> None:
    (exchange,) = load_file(FIXTURE)
    facts = client_view.compare_views(exchange.to_dict())
    assert facts["has_client_view"]
    assert facts["captured_failed"] and "empty-content" in facts["captured_kinds"]
    assert not facts["wire_failed"]
    assert facts["signature"] == client_view.CONTENT_ONLY


def test_signature_needs_the_same_content() -> None:
    wire = {"choices": [{"message": {"content": "It is sunny.", "tool_calls": [{"id": "a"}]}}]}
    garbled = {"choices": [{"message": {"content": "It is"}}]}
    assert client_view.client_signature(wire, garbled) is None
    kept = {"choices": [{"message": {"content": "It is sunny."}}]}
    assert client_view.client_signature(wire, kept) == client_view.CONTENT_ONLY


@pytest.mark.parametrize(
    ("request_body", "found"),
    [
        ({"enable_thinking": False}, ["$.enable_thinking"]),
        ({"think": False}, ["$.think"]),
        ({"thinking": {"type": "disabled"}}, ["$.thinking"]),
        (
            {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
            ["$.extra_body.chat_template_kwargs.enable_thinking"],
        ),
        ({"enable_thinking": True}, []),  # asks for thinking: nothing dropped that matters
        # the documented flag is on the wire too: the server got it
        ({"enable_thinking": False, "chat_template_kwargs": {"enable_thinking": False}}, []),
        ({}, []),
    ],
)
def test_dropped_thinking_flags(request_body: dict[str, Any], found: list[str]) -> None:
    assert client_view.dropped_thinking_flags({"messages": [], **request_body}) == found


def test_observation_arms_are_not_replayed() -> None:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    names = [a.name for a in probes.request_arms(request)]
    assert "client-view" not in names and "conversation-history" not in names
    planned = {a.name: a for a in probes.plan_arms(Stack(ServerConfig()), request)}
    assert planned["client-view"].when == "observe"


# --------------------------------------------------------------------- client-handling


def _client_facts(**extra: Any) -> dict[str, Any]:
    facts = {
        "name": "client-view",
        "dropped_flags": [],
        "has_client_view": True,
        "captured_failed": True,
        "captured_kinds": ["empty-content"],
        "wire_failed": False,
        "signature": "content-only",
        "streamed": {
            "n": 8,
            "server_failures": 0,
            "client_failures": 8,
            "decision": "removes",
            "p_value": 8e-5,
        },
    }
    facts.update(extra)
    return facts


def _client(arms: dict[str, ArmOutcome], facts: dict[str, Any], planned: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return client_handling.rule(arms, _obs(facts, planned))


CLEAN_BASELINE = {"baseline": _arm("baseline", 0, 16, "baseline")}


def test_client_handling_confirmed_on_a_consistent_capture() -> None:
    verdict = _client(CLEAN_BASELINE, _client_facts())
    assert verdict.status == "confirmed"
    assert "8/8" in verdict.rationale and "0/16" in verdict.rationale


def test_client_handling_not_confirmed_when_the_server_fails_too() -> None:
    arms = {"baseline": _arm("baseline", 6, 16, "baseline")}
    assert _client(arms, _client_facts()).status == "suspected"


def test_client_handling_needs_enough_non_streamed_replays() -> None:
    arms = {"baseline": _arm("baseline", 0, 4, "baseline")}
    assert _client(arms, _client_facts()).status == "suspected"


def test_client_handling_not_confirmed_from_an_undecided_stream() -> None:
    streamed = {"n": 4, "server_failures": 0, "client_failures": 1, "decision": "undecided"}
    assert _client(CLEAN_BASELINE, _client_facts(streamed=streamed)).status == "suspected"


def test_client_handling_rejected_when_the_wire_shows_the_failure() -> None:
    facts = _client_facts(wire_failed=True, wire_kinds=["empty-content"], streamed=None)
    verdict = _client(CLEAN_BASELINE, facts)
    assert verdict.status == "rejected" and "server's own stream" in verdict.rationale


def test_client_handling_rejected_when_the_client_view_passes() -> None:
    facts = _client_facts(captured_failed=False, signature=None, streamed=None)
    assert _client(CLEAN_BASELINE, facts).status == "rejected"


def test_client_handling_rejected_when_the_streams_fail_alike() -> None:
    streamed = {"n": 8, "server_failures": 8, "client_failures": 8, "decision": "unchanged"}
    assert _client(CLEAN_BASELINE, _client_facts(streamed=streamed)).status == "rejected"


def test_unknown_client_loss_stays_suspected() -> None:
    facts = _client_facts(signature=None, streamed=None)
    assert _client(CLEAN_BASELINE, facts).status == "suspected"


def test_dropped_thinking_flag_confirmed_by_the_thinking_off_arm() -> None:
    facts = {"name": "client-view", "dropped_flags": ["$.extra_body.chat_template_kwargs"]}
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline"),
        "thinking-off": _arm("thinking-off", 0, 8, "removes"),
    }
    verdict = _client(arms, facts, ("baseline", "thinking-off"))
    assert verdict.status == "confirmed" and "never reached" in verdict.rationale
    arms["thinking-off"] = _arm("thinking-off", 8, 8, "unchanged")
    assert _client(arms, facts, ("baseline", "thinking-off")).status == "rejected"


def test_dropped_thinking_flag_never_confirmed_without_reproduction() -> None:
    facts = {"name": "client-view", "dropped_flags": ["$.enable_thinking"]}
    arms = {
        "baseline": _arm("baseline", 0, 16, "baseline"),
        "thinking-off": _arm("thinking-off", 0, 16, "no-baseline-failure"),
    }
    verdict = _client(arms, facts, ("baseline", "thinking-off"))
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_no_client_evidence_rejected_only_when_the_server_fails_regardless() -> None:
    facts = {"name": "client-view", "dropped_flags": [], "has_client_view": False}
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline"),
        "thinking-off": _arm("thinking-off", 8, 8, "unchanged"),
    }
    assert _client(arms, facts).status == "rejected"
    # thinking off removes it: a client that meant it off may have dropped it -- unknown
    arms["thinking-off"] = _arm("thinking-off", 0, 8, "removes")
    assert _client(arms, facts).status == "suspected"


def test_client_handling_untested_without_the_observation() -> None:
    verdict = client_handling.rule(CLEAN_BASELINE, Observations())
    assert verdict.status == "suspected" and verdict.basis == "untested"


# ------------------------------------------------------------------ conversation-shape


def test_python_literal_arguments_become_json_text() -> None:
    request = conversation_request()
    body, changes = history.normalise_history(request)
    call = body["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}
    assert changes == ["tool-call arguments as JSON text"]
    assert body["messages"][-1] == request["messages"][-1]
    assert request["messages"][1]["tool_calls"][0]["function"]["arguments"].startswith("{'")


def test_history_normalisation_rules() -> None:
    request = {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "<think>look it up</think>Calling.",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "content": {"temp": 12}},
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}], "thinking": "t"},
            {"role": "user", "content": "again"},
        ]
    }
    body, changes = history.normalise_history(request)
    first, tool, second = body["messages"][1:4]
    assert first["content"] == "Calling." and first["reasoning_content"] == "look it up"
    assert first["tool_calls"][0]["id"] == "call_0"
    assert first["tool_calls"][0]["function"]["arguments"] == "{}"
    assert tool["tool_call_id"] == "call_0" and tool["content"] == '{"temp": 12}'
    assert second["content"] == "Done." and second["reasoning_content"] == "t"
    assert set(changes) == {
        "content as text",
        "inline reasoning moved to reasoning_content",
        "reasoning passed back as reasoning_content",
        "tool-call arguments as JSON text",
        "tool-call ids",
    }


def test_history_arm_planned_only_when_normalising_changes_the_history() -> None:
    arm, stack = history.HistoryNormalised(), Stack(ServerConfig())
    single = {"messages": [{"role": "user", "content": "q"}]}
    assert arm.plan(stack, single) is None
    normal, _ = history.normalise_history(conversation_request())
    assert arm.plan(stack, normal) is None
    planned = arm.plan(stack, conversation_request())
    assert planned is not None and planned.decides == ("conversation-shape",)
    assert "JSON text" in planned.variant


def _shape(turns: int, changes: list[str]) -> dict[str, Any]:
    return {"name": "conversation-history", "assistant_turns": turns, "changes": changes}


def test_conversation_shape_rejected_on_a_single_turn() -> None:
    verdict = conversation_shape.CAUSE.decide(CLEAN_BASELINE, _obs(_shape(0, [])))
    assert verdict.status == "rejected" and "single-turn" in verdict.rationale


def test_conversation_shape_untested_on_a_normal_history() -> None:
    verdict = conversation_shape.CAUSE.decide(CLEAN_BASELINE, _obs(_shape(2, [])))
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_conversation_shape_confirmed_and_rejected_by_the_arm() -> None:
    facts = _shape(1, ["tool-call arguments as JSON text"])
    planned = ("baseline", "history-normalised")
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline"),
        "history-normalised": _arm("history-normalised", 0, 8, "removes"),
    }
    verdict = conversation_shape.CAUSE.decide(arms, _obs(facts, planned))
    assert verdict.status == "confirmed" and "JSON text" in verdict.rationale
    arms["history-normalised"] = _arm("history-normalised", 8, 8, "unchanged")
    assert conversation_shape.CAUSE.decide(arms, _obs(facts, planned)).status == "rejected"
    # never confirmed when the baseline does not reproduce the failure
    arms = {
        "baseline": _arm("baseline", 0, 16, "baseline"),
        "history-normalised": _arm("history-normalised", 0, 16, "no-baseline-failure"),
    }
    assert conversation_shape.CAUSE.decide(arms, _obs(facts, planned)).status == "suspected"


# ------------------------------------------------------------------ client-lost-reply


def _lost(exchange: Any) -> list[Any]:
    from triage.symptoms import classify

    return [f for f in classify(exchange) if f.kind == "client-lost-reply"]


def test_client_lost_reply_names_the_lost_tool_call() -> None:
    (exchange,) = load_file(FIXTURE)
    (finding,) = _lost(exchange)
    assert not finding.passed and "get_weather" in finding.reason


def test_client_lost_reply_passes_when_only_the_reasoning_is_hidden() -> None:
    (exchange,) = load_file(FIXTURE)
    wire = exchange.wire_response["choices"][0]["message"]  # type: ignore[index]
    exchange.response["choices"][0]["message"]["tool_calls"] = wire["tool_calls"]  # type: ignore[index]
    (finding,) = _lost(exchange)
    assert finding.passed and "reasoning only" in finding.reason


def test_client_lost_reply_passes_without_a_client_view() -> None:
    (exchange,) = load_file(FIXTURE)
    exchange.wire_response = None
    assert [f.passed for f in _lost(exchange)] == [True]


# ------------------------------------------------ streamed replays (httpx MockTransport)


def _run_observe(monkeypatch: pytest.MonkeyPatch, stream: str) -> dict[str, Any]:
    import asyncio

    import httpx

    from triage.llama import client as llama_client

    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=stream.encode(), headers=headers)

    real = llama_client.LlamaClient

    def fake(base_url: str, **kwargs: Any) -> Any:
        return real(base_url, transport=httpx.MockTransport(answer), **kwargs)

    monkeypatch.setattr(llama_client, "LlamaClient", fake)
    (exchange,) = load_file(FIXTURE)

    class _Server:
        base_url, api_key = "http://127.0.0.1:9", None

    ctx = probes.ObserveContext(
        _Server(), _Server(), exchange.request, 100, 30.0, exchange=exchange.to_dict()
    )
    facts = asyncio.run(client_view.observe(ctx))
    assert all(body["stream"] is True for body in sent)
    assert [body["seed"] for body in sent] == list(range(100, 100 + len(sent)))
    return facts


def test_streamed_replays_through_the_client_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = json.loads(FIXTURE.read_text())["stream"]  # the drill server's real stream
    facts = _run_observe(monkeypatch, stream)
    streamed = facts["streamed"]
    assert streamed["decision"] == "removes" and streamed["n"] == 8
    assert streamed["server_failures"] == 0 and streamed["client_failures"] == 8


def test_streamed_replays_that_fail_on_the_server_too_are_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty = (
        'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        "data: [DONE]\n\n"
    )
    streamed = _run_observe(monkeypatch, empty)["streamed"]
    assert streamed["server_failures"] == streamed["client_failures"] == streamed["n"]
    assert streamed["decision"] == "unchanged"  # the client did not lose anything
