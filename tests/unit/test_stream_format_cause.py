"""stream-format (cause 22): the rewriting proxy's deltas are what the strict validator
reports; the stream-vs-nonstream observation sends nothing for an unstreamed request or a
well-formed captured stream, and otherwise pairs streamed and stream:false replies (each
stream validated per delta); the cause is confirmed only when the streams reproduce the
violation and stream:false removes it -- pure, the server a mock transport."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import httpx
import pytest

from triage.capture import exchange_from_http
from triage.capture.stream_format import STREAM_FORMAT_KEY
from triage.causes import ArmOutcome, Observations
from triage.drills.stream_proxy import DROP_ID, REPEAT_NAME, DeltaRewriter, rewrite_line
from triage.engine.arms import stream_format as arm
from triage.engine.causes.stream_format import CAUSE
from triage.probes import ObserveContext
from triage.stackfile import ServerConfig, Stack
from triage.symptoms import classify

REQUEST: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    "stream": True,
}
ARGUMENTS = ('{"loca', 'tion": "Pa', 'ris"}')


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def well_formed_stream() -> str:
    """A tool call streamed as llama-server b11434 does: the first delta with index, id,
    type and name, then arguments only, finish_reason, [DONE]."""
    first = {"index": 0, "id": "call_1", "type": "function"}
    lines = [
        _chunk({"role": "assistant", "content": None}),
        _chunk({"tool_calls": [{**first, "function": {"name": "get_weather", "arguments": ""}}]}),
        *(
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
            for part in ARGUMENTS
        ),
        _chunk({}, "tool_calls"),
        "data: [DONE]",
    ]
    return "".join(line + "\n\n" for line in lines)


def _rewritten(stream: str, mode: str) -> str:
    rewriter = DeltaRewriter(mode)
    lines = stream.encode().splitlines(keepends=True)
    return b"".join(rewrite_line(line, rewriter) for line in lines).decode()


def _codes(stream: str) -> list[str]:
    exchange = exchange_from_http(REQUEST, stream.encode(), status=200)
    record = exchange.response.get(STREAM_FORMAT_KEY) or {}  # type: ignore[union-attr]
    return [v["code"] for v in record.get("violations", [])]


# ------------------------------------------------------------------ the rewriting proxy


def test_the_proxy_resends_the_name_in_every_later_delta_and_the_validator_sees_each() -> None:
    assert _codes(well_formed_stream()) == []
    broken = _rewritten(well_formed_stream(), REPEAT_NAME)
    assert _codes(broken) == ["tool-name-repeated"] * len(ARGUMENTS)
    # The lenient re-assembly still shows one name and whole arguments: only the strict
    # per-delta check sees the break.
    exchange = exchange_from_http(REQUEST, broken.encode(), status=200)
    call = exchange.response["choices"][0]["message"]["tool_calls"][0]  # type: ignore[index]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}
    failed = [f for f in classify(exchange) if f.kind == arm.KIND and not f.passed]
    assert len(failed) == len(ARGUMENTS)


def test_the_proxy_can_drop_the_first_deltas_id_instead() -> None:
    assert _codes(_rewritten(well_formed_stream(), DROP_ID)) == ["tool-first-delta"]


def test_the_proxy_leaves_other_lines_alone() -> None:
    rewriter = DeltaRewriter(REPEAT_NAME)
    for line in (b"data: [DONE]\n", b"\n", b"event: ping\n", b"data: not json\n"):
        assert rewrite_line(line, rewriter) == line
    assert rewriter.rewritten == 0


# --------------------------------------------------------------------------- the capture


def test_captured_violations_read_a_streamed_capture_only() -> None:
    good = exchange_from_http(REQUEST, well_formed_stream().encode(), status=200).to_dict()
    bad = exchange_from_http(
        REQUEST, _rewritten(well_formed_stream(), REPEAT_NAME).encode(), status=200
    ).to_dict()
    assert arm.captured_violations(good) == []
    assert [v["code"] for v in arm.captured_violations(bad) or []] == ["tool-name-repeated"] * 3
    unstreamed = {**good, "request": {**REQUEST, "stream": False}}
    assert arm.captured_violations(unstreamed) is None
    assert arm.captured_violations(None) is None


# ------------------------------------------------------------------- the observation hook


class _Server:
    def __init__(self, url: str) -> None:
        self.base_url, self.api_key = url, None


def _answer() -> dict[str, Any]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "".join(ARGUMENTS)},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def _transport(gateway_breaks: bool, sent: list[tuple[str, bool]]) -> httpx.MockTransport:
    """A llama-server at :1 (well formed) and a gateway at :2 that rewrites streams when
    `gateway_breaks`; the non-streamed answer is always well formed."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        gateway = request.url.port == 2
        sent.append((request.url.host + f":{request.url.port}", bool(body.get("stream"))))
        if not body.get("stream"):
            return httpx.Response(200, json=_answer())
        stream = well_formed_stream()
        if gateway and gateway_breaks:
            stream = _rewritten(stream, REPEAT_NAME)
        return httpx.Response(
            200, content=stream.encode(), headers={"content-type": "text/event-stream"}
        )

    return httpx.MockTransport(handle)


def _observe(
    monkeypatch: pytest.MonkeyPatch,
    exchange: dict[str, Any] | None,
    *,
    request: dict[str, Any] = REQUEST,
    gateway_breaks: bool = True,
) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    sent: list[tuple[str, bool]] = []
    transport = _transport(gateway_breaks, sent)
    monkeypatch.setattr(arm, "LlamaClient", functools.partial(arm.LlamaClient, transport=transport))
    server, gateway = _Server("http://server:1"), _Server("http://gateway:2")
    ctx = ObserveContext(server, server, request, 100, 30.0, exchange=exchange)
    ctx.client_side = gateway
    return asyncio.run(arm.observe(ctx)), sent


def _decide(facts: dict[str, Any]) -> Any:
    return CAUSE.decide(
        {"baseline": ArmOutcome("baseline", 8, 0, "no-baseline-failure")},
        Observations(facts={arm.ARM: facts}),
    )


def test_an_unstreamed_request_sends_nothing_and_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts, sent = _observe(monkeypatch, None, request={**REQUEST, "stream": False})
    assert sent == [] and facts["streamed"] is False
    verdict = _decide(facts)
    assert verdict.status == "rejected" and "did not stream" in verdict.rationale


def test_a_well_formed_captured_stream_sends_nothing_and_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = exchange_from_http(REQUEST, well_formed_stream().encode(), status=200).to_dict()
    facts, sent = _observe(monkeypatch, good)
    assert sent == [] and facts["captured_violations"] == 0
    verdict = _decide(facts)
    assert verdict.status == "rejected" and "well formed" in verdict.rationale


def test_streams_broken_by_the_gateway_confirm_it_with_paired_k_of_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = _rewritten(well_formed_stream(), REPEAT_NAME)
    capture = exchange_from_http(REQUEST, broken.encode(), status=200).to_dict()
    facts, sent = _observe(monkeypatch, capture)
    pairs = facts["pairs"]
    # Eight pairs through the gateway (streamed + stream:false), then eight streams direct.
    assert sent[:16] == [("gateway:2", True), ("gateway:2", False)] * 8
    assert sent[16:] == [("server:1", True)] * arm.DIRECT_REPLAYS
    assert (pairs["n"], pairs["stream_failures"], pairs["nonstream_failures"]) == (8, 8, 0)
    assert pairs["same_answer"] == 8 and pairs["codes"] == {"tool-name-repeated": 8}
    assert facts["direct"] == {"n": 8, "failures": 0}
    verdict = _decide(facts)
    assert verdict.status == "confirmed" and verdict.deciding_probe == arm.ARM
    assert "streamed 8/8" in verdict.rationale and "stream:false 0/8" in verdict.rationale
    assert "gateway in front rewrites" in verdict.rationale


def test_streams_that_no_longer_break_are_not_a_reproduction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = _rewritten(well_formed_stream(), REPEAT_NAME)
    capture = exchange_from_http(REQUEST, broken.encode(), status=200).to_dict()
    facts, _ = _observe(monkeypatch, capture, gateway_breaks=False)
    assert facts["pairs"]["stream_failures"] == 0 and "direct" not in facts
    verdict = _decide(facts)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "do not reproduce" in verdict.rationale


# ---------------------------------------------------------------------------- the rule


def _pairs(k_stream: int, k_plain: int, n: int, decision: str, **extra: Any) -> dict[str, Any]:
    pairs = {
        "n": n,
        "errors": 0,
        "stream_failures": k_stream,
        "nonstream_failures": k_plain,
        "same_answer": n - k_plain,
        "codes": {"tool-first-delta": k_stream},
        "nonstream_kinds": {"empty-content": k_plain} if k_plain else {},
        "decision": decision,
        "p_value": 0.001,
    }
    return {"name": arm.ARM, "streamed": True, "captured_violations": None, "pairs": pairs, **extra}


def test_the_non_streamed_reply_failing_as_often_rejects_it() -> None:
    verdict = _decide(_pairs(8, 8, 8, "unchanged"))
    assert verdict.status == "rejected" and "fail as often" in verdict.rationale


def test_an_intermittent_break_stays_suspected_until_the_pairs_decide() -> None:
    verdict = _decide(_pairs(3, 0, 8, "undecided"))
    assert verdict.status == "suspected" and "undecided at the cap" in verdict.rationale


def test_a_server_that_breaks_the_stream_itself_is_named() -> None:
    verdict = _decide(_pairs(8, 0, 8, "removes", direct={"n": 8, "failures": 8}))
    assert verdict.status == "confirmed" and "the server itself" in verdict.rationale


def test_no_observation_is_untested_never_rejected() -> None:
    for facts in ({"name": arm.ARM, "error": "RuntimeError: boom"}, None):
        obs = Observations(facts={arm.ARM: facts} if facts else {})
        verdict = CAUSE.decide({}, obs)
        assert verdict.status == "suspected" and verdict.basis == "untested"


def test_the_arm_is_planned_for_every_run_as_an_observation() -> None:
    planned = arm.StreamVsNonStream().plan(Stack(ServerConfig()), {"messages": []})
    assert planned is not None and planned.when == "observe" and planned.decides == (arm.CAUSE,)
