"""Drills for `client-handling` and `conversation-shape` (issue 13).

Both reuse the gemma4-toolcall chain (the official Gemma 4 template; asked for the weather
in Paris it thinks, then calls `get_weather({"location": "Paris"})`) at temperature 0, so
the server's own answer is deterministic and correct; what fails is around it:

* `client-content-only`: the client streams the request and keeps only `content`. The
  server's stream carries the tool call; the client shows an empty reply. A 1-layer model
  cannot hold a client, so the client half is data: the capture (format `client-view`)
  pairs the drill server's real stream with that client's view of it
  (`client_view_of(stream)`); tests/fixtures/captures/client/content-only.json is one
  recorded from b11434, and the integration test records a fresh one from the drill server.
* `conversation-python-args`: a second turn whose history carries the first turn's tool
  call with Python-literal arguments (`{'location': 'Paris'}`, a client that used `str()`
  instead of `json.dumps`). llama-server refuses to render that history: HTTP 500 "Failed
  to parse tool call arguments as JSON", every time. With the history normalised the turn
  is answered (the tool is called again).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.drills import gemma4
from triage.drills.drill import Drill, ExpectedCause, finish
from triage.engine.servers import open_server
from triage.llama.client import LlamaClient
from triage.stackfile import load_stack

__all__ = [
    "CONVERSATION_DRILL",
    "STREAM_DRILL",
    "client_content_only",
    "client_view_capture",
    "conversation_python_args",
]

STREAM_DRILL = "client-content-only"
CONVERSATION_DRILL = "conversation-python-args"

# The first turn's tool call as a careless client sends it back (str() of a dict).
PYTHON_ARGS = "{'location': 'Paris'}"


def _seed_causes(expected: dict[str, tuple[str, list[str], str]]) -> dict[str, ExpectedCause]:
    return {
        cause: {"real": False, "expected": exp, "accept": accept, "why": why}
        for cause, (exp, accept, why) in expected.items()
    }


def _not_reproduced(cause: str) -> tuple[str, list[str], str]:
    return (
        "suspected",
        ["suspected"],
        f"The server never fails on this request, so nothing is attributed to {cause}.",
    )


def client_view_capture(request: JsonObject, stream: str) -> JsonObject:
    """A client-view capture: the server's raw stream and what a content-only client shows
    (the content deltas, no tool calls, no reasoning)."""
    content = []
    for line in stream.splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            chunk = json.loads(line[5:])
            delta = chunk["choices"][0]["delta"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            content.append(delta["content"])
    return {"request": request, "stream": stream, "client_view": {"content": "".join(content)}}


def record_capture(drill: Drill, folder: Path, timeout: float = 120.0) -> Path:
    """Record the client-view capture of the `client-content-only` drill: the drill
    server's real streamed answer to its `streamed` request (seed 7) and a content-only
    client's view of it, written to `folder/client-view.json`. The server is stopped on
    return, also on failure."""

    async def stream(base_url: str, request: JsonObject) -> str:
        client = LlamaClient(base_url, timeout=timeout)
        try:
            result = await client.chat_stream({**request, "seed": 7})
        finally:
            await client.aclose()
        if not (result.ok and result.tool_calls):
            raise RuntimeError(f"{STREAM_DRILL}: the drill server streamed no tool call")
        return result.raw.decode()

    stack = load_stack(drill.out_dir / "stack.toml")
    request = drill.request("streamed")
    with open_server(stack.server, folder / "record-logs", 60.0) as server:
        raw = asyncio.run(stream(server.base_url, request))
    path = folder / "client-view.json"
    path.write_text(json.dumps(client_view_capture(request, raw)))
    return path


def client_content_only(out_dir: Path, template: str) -> Drill:
    spec = gemma4.toolcall_design()
    messages = [{"role": "user", "content": gemma4.WEATHER_PROMPT}]
    streamed = {
        "messages": messages,
        "tools": [gemma4.WEATHER_TOOL],
        "max_tokens": 256,
        "temperature": 0.0,
        "stream": True,
    }
    causes = _seed_causes({c: _not_reproduced(c) for c in gemma4.CAUSE_IDS})
    causes["client-handling"] = {
        "real": True,
        "expected": "confirmed",
        "accept": ["confirmed"],
        "why": "The server streams a correct get_weather call; the client keeps only "
        "content and shows an empty reply. Streamed replays re-assembled pass, the same "
        "streams through a content-only client fail, and the non-streamed baseline passes.",
    }
    causes["conversation-shape"] = {
        "real": False,
        "expected": "rejected",
        "accept": ["rejected"],
        "why": "Single-turn request.",
    }
    manifest: JsonObject = {  # manifest.json as written
        "parameters": {"client_signature": "content-only", "temperature": 0.0},
        "capture": "client-view: the drill server's stream of request-streamed plus "
        "client_view_of(stream); recorded example tests/fixtures/captures/client/"
        "content-only.json",
        "causes": causes,
        "requests": [
            {
                "name": "streamed",
                "role": "failing",
                "expect": {
                    "server": {"finish_reason": "tool_calls", "tool": "get_weather"},
                    "client_view": {"content_chars": 0, "tool_calls": 0},
                    "failure_rate": {"server": 0.0, "client": 1.0},
                },
            }
        ],
    }
    return finish(STREAM_DRILL, spec, out_dir, template, manifest, [streamed], {})


def conversation_request() -> JsonObject:
    """The second turn, its history holding a tool call with Python-literal arguments."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": PYTHON_ARGS},
    }
    return {
        "messages": [
            {"role": "user", "content": gemma4.WEATHER_PROMPT},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature_c": 12}'},
            {"role": "assistant", "content": "It is 12 degrees in Paris."},
            {"role": "user", "content": gemma4.WEATHER_PROMPT},
        ],
        "tools": [gemma4.WEATHER_TOOL],
        "max_tokens": 256,
        "temperature": 0.0,
    }


def conversation_python_args(out_dir: Path, template: str) -> Drill:
    spec = gemma4.toolcall_design()
    unchanged = "The history is refused before any token is sampled: HTTP 500 in every arm "
    causes = _seed_causes(
        {
            "reasoning-exhausts-budget": (
                "rejected",
                ["rejected"],
                unchanged + "with thinking off too.",
            ),
            "speculative-decoding": (
                "not-confirmed",
                ["rejected", "suspected"],
                unchanged + "without the draft model too.",
            ),
            "quantized-weights": (
                "not-confirmed",
                ["rejected", "suspected"],
                unchanged + "with the alternate weights too.",
            ),
            "server-build": ("suspected", ["suspected"], "One build: not testable."),
            "output-parsing": (
                "not-confirmed",
                ["rejected", "suspected"],
                "Nothing is generated, so nothing is parsed.",
            ),
            "token-limit": ("not-confirmed", ["rejected", "suspected"], unchanged + "at 4x."),
        }
    )
    causes["conversation-shape"] = {
        "real": True,
        "expected": "confirmed",
        "accept": ["confirmed"],
        "why": "llama-server cannot parse the history's tool-call arguments (Python literal, "
        "not JSON): HTTP 500 every time; with the history normalised the turn is answered.",
    }
    causes["client-handling"] = {
        "real": False,
        "expected": "not-confirmed",
        "accept": ["rejected", "suspected"],
        "why": "No client view and no dropped flag; the server's own replies fail.",
    }
    manifest: JsonObject = {  # manifest.json as written
        "parameters": {"history_shape": "tool-call arguments as a Python literal"},
        "causes": causes,
        "requests": [
            {
                "name": "second-turn",
                "role": "failing",
                "expect": {"status": 500, "failure_rate": 1.0},
            }
        ],
    }
    request = conversation_request()
    return finish(CONVERSATION_DRILL, spec, out_dir, template, manifest, [request], {})
