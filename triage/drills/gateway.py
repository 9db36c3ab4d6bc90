"""The gateway drills: `gateway-timeout-nginx` and `gateway-timeout-litellm`.

A Gemma 4 drill (official template) whose model thinks one sentence and then writes a long
harbour inventory (a couple of thousand tokens) and ends its turn: a healthy answer that
simply takes longer than the gateway in front of the server waits. The incident: the client
talks to a real gateway -- nginx (`proxy_read_timeout`) or the LiteLLM proxy (`timeout`) --
whose read timeout is shorter than the generation, so every request through it ends in the
gateway's 504 page (nginx) or LiteLLM's timeout error, while llama-server, asked direct,
answers in full.

The drill is served, not only built: `serve(drill, folder, kind)` starts the drill's
llama-server, times one direct answer, starts the gateway in front of it with a read timeout
of a third of that time (at most 2 s), records the client's failing exchange through the
gateway, and writes a stack.toml with `[server].url` (the server) and `[gateway].url`; all
processes stop when the block ends. What is honest: the timeout is set from a measured
generation time so the drill fails on a fast machine too; the model's answer is the same
through the gateway and direct -- only the gateway's patience differs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kb.domain.diagnosis import Finding
from kb.jsontypes import JsonObject
from triage.capture import exchange_from_http
from triage.drills import gemma4
from triage.drills.context import _write
from triage.drills.drill import Drill, ExpectedCause
from triage.drills.gateways import LITELLM_KEY_ENV, LITELLM_MODEL, running_gateway
from triage.drills.language import Design
from triage.llama.build import find_server_binary
from triage.llama.launcher import ServerSpec, launch
from triage.symptoms import classify

NGINX = "gateway-timeout-nginx"
LITELLM = "gateway-timeout-litellm"
KINDS = {NGINX: "nginx", LITELLM: "litellm"}
PROMPT = "List the whole harbour store inventory, every crate."
THOUGHT = "\nThe user wants the full inventory. I will list every crate."
INTRO = "Harbour store inventory:"
GOODS = (
    "rope coils",
    "tin lamps",
    "canvas bales",
    "cork floats",
    "brass cleats",
    "tar barrels",
    "oak oars",
    "iron chain",
)
CRATES = 400
# 4 slots of 4096 tokens: the answer (~1,700 tokens) fits a slot, so it ends on its own.
SERVER_ARGS = ["-c", "16384", "-np", "4", "-t", "1", "-tb", "1"]
# The gateway's read timeout: a third of the measured direct answer time, at most this.
MAX_READ_TIMEOUT = 2.0
MIN_READ_TIMEOUT = 0.5


def inventory() -> str:
    """The answer: one line per crate (distinct, as a drill's tokens must be)."""
    lines = [
        f"Crate {index:03d}: {GOODS[index % len(GOODS)]}, shelf {index // 8 + 1}, "
        f"row {index % 8 + 1}."
        for index in range(1, CRATES + 1)
    ]
    return INTRO + "\n" + "\n".join(lines)


def design() -> tuple[Design, dict[str, Any]]:
    """Think one sentence, write the whole inventory, end the turn."""
    spec = gemma4._base_design("gateway-timeout")
    vocab = spec.vocab
    thought = spec.words(spec.chunks(THOUGHT, gemma4.REASONING_PIECE))
    answer = spec.words(spec.chunks(inventory(), gemma4.ANSWER_PIECE))
    channel_end, turn_end = vocab.id("<channel|>"), vocab.id("<turn|>")
    spec.link([*gemma4._opening(spec), *thought, channel_end, *answer, turn_end])
    facts = {
        "thought_tokens": len(thought),
        "answer_tokens": len(answer),
        "answer_chars": len(inventory()),
        "generated_tokens": 2 + len(thought) + 1 + len(answer) + 1,
    }
    return spec, facts


def _cause(expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes(kind: str) -> dict[str, ExpectedCause]:
    """Expected verdicts: gateway-timeout confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    untested = ["suspected"]
    return {
        "gateway-timeout": _cause(
            "confirmed",
            ["confirmed"],
            f"{kind}'s read timeout is a third of the generation time: every request through "
            "it ends in the gateway's error at that time; direct, every answer completes.",
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "The thought is one sentence and ends."
        ),
        "token-limit": _cause(
            "not-confirmed", not_confirmed, "The request sets no max_tokens to raise."
        ),
        "output-parsing": _cause(
            "not-confirmed", not_confirmed, "Nothing fails to parse: the gateway cuts the wait."
        ),
        "speculative-decoding": _cause("not-confirmed", not_confirmed, "No speculative decoding."),
        "quantized-weights": _cause("suspected", untested, "Not testable: a running server."),
        "server-build": _cause("suspected", untested, "Not testable: a running server."),
        "context-shift": _cause(
            "not-confirmed", not_confirmed, "The answer ends on its own within the slot."
        ),
    }


def _request() -> JsonObject:
    # `model`: the name LiteLLM routes by (llama-server serves its one model whatever it is).
    return {
        "model": LITELLM_MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0.0,
    }


def _build(name: str, out_dir: Path, template: str) -> Drill:
    spec, facts = design()
    manifest = {
        "parameters": {**facts, "gateway": KINDS[name], "max_read_timeout": MAX_READ_TIMEOUT},
        "causes": manifest_causes(KINDS[name]),
        "served": True,
        "requests": [
            {
                "name": "through-gateway",
                "role": "failing",
                "expect": {"status": 504 if KINDS[name] == "nginx" else 408, "failure_rate": 1.0},
            }
        ],
    }
    return _write(name, spec, out_dir, template, SERVER_ARGS, manifest, [_request()])


def build_nginx(out_dir: Path, template: str) -> Drill:
    """Generate the gateway-timeout-nginx drill into `out_dir` (serve it with `serve`)."""
    return _build(NGINX, out_dir, template)


def build_litellm(out_dir: Path, template: str) -> Drill:
    """Generate the gateway-timeout-litellm drill into `out_dir` (serve it with `serve`)."""
    return _build(LITELLM, out_dir, template)


@dataclass
class Served:
    """A served drill: the stack file that names the running server and gateway, and the
    client's failing exchange through the gateway (request, exchange dict, findings)."""

    stack_path: Path
    request: dict[str, Any]
    exchange: dict[str, Any]
    findings: list[Finding]
    direct_seconds: float
    read_timeout: float
    gateway_url: str
    server_url: str
    facts: dict[str, Any] = field(default_factory=dict)


async def _post(url: str, body: JsonObject, key: str | None) -> tuple[int, bytes, float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=120.0) as client:
        response = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    return response.status_code, response.content, time.monotonic() - started


@contextmanager
def serve(drill: Drill, folder: Path, binary: Path | None = None) -> Iterator[Served]:
    """Start the drill's server and its gateway; yield the stack and the failing capture."""
    kind = KINDS[drill.name]
    body = drill.requests[0]
    spec = ServerSpec(binary or find_server_binary(), drill.model, list(drill.server_args))
    with launch(spec, folder / "server") as server:
        status, _, direct = asyncio.run(_post(server.base_url, body, None))
        if status != 200:
            raise RuntimeError(f"drill {drill.name}: direct answer HTTP {status}")
        timeout = max(MIN_READ_TIMEOUT, min(MAX_READ_TIMEOUT, direct / 3))
        with running_gateway(kind, server.base_url, folder / kind, timeout) as gateway:
            status, raw, elapsed = asyncio.run(_post(gateway.url, body, gateway.api_key))
            exchange = exchange_from_http(body, raw, status=status, elapsed_ms=elapsed * 1000)
            lines = [
                f"# Drill {drill.name}: served by triage.drills.gateway (a running llama-server",
                f"# behind {kind}, read timeout {timeout:.2f} s); ground truth in manifest.json",
                "[server]",
                f"url = {json.dumps(server.base_url)}",
                f"args = {json.dumps(list(drill.server_args))}",
                "",
                "[gateway]",
                f"url = {json.dumps(gateway.url)}",
                f"name = {json.dumps(kind)}",
            ]
            if gateway.api_key:
                os.environ[LITELLM_KEY_ENV] = gateway.api_key
                lines.append(f"api_key_env = {json.dumps(LITELLM_KEY_ENV)}")
            stack_path = folder / "stack.toml"
            stack_path.write_text("\n".join(lines) + "\n")
            yield Served(
                stack_path,
                body,
                exchange.to_dict(),
                [f.record() for f in classify(exchange)],
                direct,
                timeout,
                gateway.url,
                server.base_url,
                {"status": status, "elapsed": elapsed, "gateway_pid": gateway.process.pid},
            )
