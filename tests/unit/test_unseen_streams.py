"""Well-formed streams written the way other OpenAI-compatible servers write them (OpenAI with
a usage chunk, Azure's empty first chunk, Ollama's one-delta tool call, a first delta with no
`type`, parallel calls): none of them may read as a stream-format violation or any failure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.symptoms import classify

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
REQUEST = {
    "model": "m",
    "stream": True,
    "tools": TOOLS,
    "messages": [{"role": "user", "content": "?"}],
}
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def _sse(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [choice],
        **extra,
    }


def _call(**fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, **fields}]}


FIRST = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
STREAMS = {
    "openai-with-usage-chunk": [
        _chunk({"role": "assistant", "content": None}),
        _chunk(_call(**FIRST)),
        _chunk(_call(function={"arguments": '{"city":'})),
        _chunk(_call(function={"arguments": '"Paris"}'})),
        _chunk({}, "tool_calls"),
        {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": USAGE},
    ],
    "azure-empty-first-chunk": [
        {"id": "", "object": "", "choices": [], "prompt_filter_results": [{"prompt_index": 0}]},
        _chunk({"role": "assistant", "content": "Hi"}),
        _chunk({}, "stop"),
    ],
    "ollama-whole-call-in-one-delta": [
        _chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_x",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            }
        ),
        _chunk({"role": "assistant", "content": ""}, "tool_calls"),
    ],
    "first-delta-without-type": [
        _chunk(_call(id="call_1", function={"name": "get_weather", "arguments": ""})),
        _chunk(_call(function={"arguments": "{}"})),
        _chunk({}, "tool_calls"),
    ],
    "parallel-calls": [
        _chunk(_call(**{**FIRST, "function": {"name": "get_weather", "arguments": "{}"}})),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ]
            }
        ),
        _chunk({}, "tool_calls"),
    ],
    "finish-and-usage-in-one-chunk": [
        _chunk({"content": "Hi"}),
        _chunk({}, "stop", usage=USAGE),
    ],
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_other_servers_well_formed_streams_raise_no_finding(name: str) -> None:
    exchange = exchange_from_http(REQUEST, _sse(STREAMS[name]), status=200)
    assert {f.kind: f.reason for f in classify(exchange) if not f.passed} == {}
