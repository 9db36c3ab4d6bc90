"""The `stream-format-proxy` drill: a streamed tool call whose deltas break the OpenAI chunk
format on the way to the client, while the same request with `stream: false` is well formed.

The model is the gemma4-toolcall chain (the official Gemma 4 template; asked for the weather
in Paris at temperature 0 it thinks, then calls `get_weather({"location": "Paris"})`). No
llama-server seen here breaks the chunk format (b11434's streamed tool call is well formed,
README "stream-format-violation"), so the drill is served with a small real HTTP proxy in
front (triage/drills/stream_proxy.py) that resends `function.name` in every later delta of a
tool call -- what some gateways and servers send, and what a client that concatenates deltas
shows as "get_weatherget_weather". Everything else (the non-streamed answer, every other
route) passes through unchanged.

`serve(drill, folder)` starts the drill's llama-server and the proxy in front of it, records
the client's streamed exchange through the proxy (seed 7) and writes a stack.toml with
`[server].url` (llama-server) and `[gateway].url` (the proxy); both processes stop when the
block ends, also on failure. What is honest: the answer and every byte but the rewritten
deltas are llama-server's own; the malformed deltas are the proxy's, by construction.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kb.domain.diagnosis import Finding
from kb.jsontypes import JsonObject
from triage.capture import exchange_from_http
from triage.drills import gemma4
from triage.drills.drill import Drill, finish
from triage.drills.stream_proxy import REPEAT_NAME, RunningProxy, running_proxy
from triage.llama.build import find_server_binary
from triage.llama.client import LlamaClient
from triage.llama.launcher import ServerSpec, launch
from triage.symptoms import classify

NAME = "stream-format-proxy"
PROXY_NAME = "stream-rewriting-proxy"
RECORD_SEED = 7


def _cause(expected: str, accept: list[str], why: str) -> JsonObject:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> JsonObject:
    """Expected verdicts: stream-format confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    quiet = "The non-streamed baseline never fails (stream:false is well formed): nothing "
    causes = {
        cause: _cause("not-confirmed", not_confirmed, quiet + f"is attributed to {cause}.")
        for cause in gemma4.CAUSE_IDS
    }
    causes["stream-format"] = _cause(
        "confirmed",
        ["confirmed"],
        "Every stream through the proxy resends function.name in later tool-call deltas "
        "(tool-name-repeated); the same requests with stream:false are well formed; direct "
        "from llama-server the streams are well formed too.",
    )
    causes["gateway-timeout"] = _cause(
        "not-confirmed", not_confirmed, "Nothing times out: the proxy answers at once."
    )
    causes["client-handling"] = _cause(
        "not-confirmed", not_confirmed, "No client view in the capture, no dropped flag."
    )
    return causes


def request() -> JsonObject:
    """The client's streamed request: the weather tool, greedy."""
    return {
        "messages": [{"role": "user", "content": gemma4.WEATHER_PROMPT}],
        "tools": [gemma4.WEATHER_TOOL],
        "max_tokens": 256,
        "temperature": 0.0,
        "stream": True,
    }


def build(out_dir: Path, template: str) -> Drill:
    """Generate the stream-format-proxy drill into `out_dir` (serve it with `serve`)."""
    manifest: JsonObject = {
        "parameters": {"proxy_mode": REPEAT_NAME, "temperature": 0.0},
        "served": True,
        "capture": "the drill server's stream of request `streamed` through the rewriting "
        "proxy (triage.drills.stream_format.serve)",
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "streamed",
                "role": "failing",
                "expect": {
                    "through_proxy": {"finding": "stream-format-violation"},
                    "stream_false": {"tool": "get_weather", "finding": None},
                    "failure_rate": 1.0,
                },
            }
        ],
    }
    return finish(NAME, gemma4.toolcall_design(), out_dir, template, manifest, [request()], {})


@dataclass
class ServedStream:
    """A served drill: the stack naming llama-server and the proxy, and the client's
    streamed exchange through the proxy (request, exchange dict, findings)."""

    stack_path: Path
    request: JsonObject
    exchange: JsonObject
    findings: list[Finding]
    proxy: RunningProxy
    server_url: str


async def _record(url: str, body: JsonObject) -> tuple[int, bytes, float]:
    client = LlamaClient(url, timeout=120.0)
    try:
        result = await client.chat_stream({**body, "seed": RECORD_SEED})
    finally:
        await client.aclose()
    return result.status_code, result.raw, result.elapsed


@contextmanager
def serve(drill: Drill, folder: Path, binary: Path | None = None) -> Iterator[ServedStream]:
    """Start the drill's llama-server and the rewriting proxy; yield the stack and the
    client's capture. Both stop when the block ends."""
    body = drill.requests[0]
    spec = ServerSpec(binary or find_server_binary(), drill.model, list(drill.server_args))
    with (
        launch(spec, folder / "server") as server,
        running_proxy(server.base_url, folder / "proxy", REPEAT_NAME) as proxy,
    ):
        status, raw, elapsed = asyncio.run(_record(proxy.url, body))
        if status != 200:
            raise RuntimeError(f"drill {drill.name}: the stream through the proxy got {status}")
        exchange = exchange_from_http(body, raw, status=status, elapsed_ms=elapsed * 1000)
        lines = [
            f"# Drill {drill.name}: served by triage.drills.stream_format (a running",
            "# llama-server behind a proxy that rewrites streamed tool-call deltas);",
            "# ground truth in manifest.json",
            "[server]",
            f"url = {json.dumps(server.base_url)}",
            f"args = {json.dumps(list(drill.server_args))}",
            "",
            "[gateway]",
            f"url = {json.dumps(proxy.url)}",
            f"name = {json.dumps(PROXY_NAME)}",
        ]
        stack_path = folder / "stack.toml"
        stack_path.write_text("\n".join(lines) + "\n")
        yield ServedStream(
            stack_path,
            body,
            exchange.to_dict(),
            [f.record() for f in classify(exchange)],
            proxy,
            server.base_url,
        )
