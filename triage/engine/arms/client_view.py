"""The `client-view` observation: what the capture says about the client, and the server's
streamed answers seen through the client's documented handling.

An observation-only arm (`when = "observe"`, no scheduler replays). Its hook, on the
incident's server, records:

* `dropped_flags`: a "thinking off" the client meant but that never reached llama-server's
  template (measured on b11434: top-level `enable_thinking`, `think`, `thinking:
  {"type": "disabled"}` and anything under a literal `extra_body` key are ignored; only
  `chat_template_kwargs.enable_thinking` and `reasoning_effort` act). Evidence from the
  captured request itself, not a probe result.
* for a `client-view` capture (raw stream + the client's view): the symptom checks on both
  views, and the documented client signature the difference matches (`content-only`: the
  client kept `content` and dropped the tool calls / reasoning the server sent);
* when the capture is internally consistent (the wire answer passes, the client's view
  fails, the signature explains the loss): paired streamed replays of the request, each
  re-assembled by triage (the server's answer) and passed through the signature (what
  that client would show), compared with the engine's sequential rule.
"""

from __future__ import annotations

import copy
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage import probes
from triage.engine.replayer import classify_reply
from triage.llama import client as llama_client
from triage.llama.client import LlamaClientError
from triage.plugin_api import Registry
from triage.probes import ObserveContext, PlannedArm
from triage.stackfile import Stack
from triage.stats import compare

__all__ = [
    "ARM",
    "CONTENT_ONLY",
    "STREAM_LOOKS",
    "ClientView",
    "client_signature",
    "compare_views",
    "dropped_thinking_flags",
    "register",
]

ARM = "client-view"
CONTENT_ONLY = "content-only"
STREAM_LOOKS = (8, 16, 32)  # paired streamed replays, looked at after each


def _off(value: Any) -> bool:
    if value is False or value in ("disabled", "off", "none", "false"):
        return True
    return isinstance(value, dict) and value.get("type") in ("disabled", "off")


def dropped_thinking_flags(request: JsonObject) -> list[str]:
    """JSON paths of a thinking-off the client sent where llama-server does not read it,
    unless the documented `chat_template_kwargs.enable_thinking` is on the wire too."""
    kwargs = request.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
        return []
    if "reasoning_effort" in request:
        return []
    found = [
        f"$.{key}"
        for key in ("enable_thinking", "think", "thinking")
        if key in request and _off(request[key])
    ]
    extra = request.get("extra_body")
    if isinstance(extra, dict):
        inner = extra.get("chat_template_kwargs")
        if isinstance(inner, dict) and _off(inner.get("enable_thinking")):
            found.append("$.extra_body.chat_template_kwargs.enable_thinking")
        found += [
            f"$.extra_body.{key}"
            for key in ("enable_thinking", "think", "thinking")
            if key in extra and _off(extra[key])
        ]
    return found


def _message(body: Any) -> JsonObject:
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


def client_signature(wire: Any, client: Any) -> str | None:
    """The documented client handling that turns the wire answer into the client's view,
    or None when the difference matches none (or there is none)."""
    sent, shown = _message(wire), _message(client)
    if not sent:
        return None
    lost_calls = bool(sent.get("tool_calls")) and not shown.get("tool_calls")
    lost_thought = bool(sent.get("reasoning_content")) and not shown.get("reasoning_content")
    same_content = (sent.get("content") or "") == (shown.get("content") or "")
    if same_content and (lost_calls or lost_thought):
        return CONTENT_ONLY
    return None


def apply_signature(signature: str, body: JsonObject) -> JsonObject:
    """What a client with `signature` shows for a server answer (a chat.completion)."""
    if signature != CONTENT_ONLY:
        raise ValueError(f"unknown client signature {signature!r}")
    shown = copy.deepcopy(body)
    message = _message(shown)
    for key in list(message):
        if key not in ("role", "content"):
            del message[key]
    return shown


class ClientViews(TypedDict, total=False):
    """The symptom checks on a capture's two views: what the client showed (`captured_*`)
    and the raw answer on the wire (`wire_*`), with the client signature that turns one
    into the other (None: no documented one does)."""

    has_client_view: bool
    captured_failed: bool
    captured_kinds: list[str]
    wire_failed: bool
    wire_kinds: list[str]
    signature: str | None


class StreamedReplays(TypedDict, total=False):
    """Paired streamed replays: the server's answers re-assembled vs the same answers
    through the client's signature, with the engine's sequential decision."""

    n: int
    errors: int
    server_failures: int
    client_failures: int
    decision: str
    p_value: float | None


class ClientViewFacts(ClientViews, total=False):
    """The `client-view` observation (stored as evidence, read by client-handling)."""

    name: str
    dropped_flags: list[str]
    has_capture: bool
    streamed: StreamedReplays
    summary: str
    error: str  # written by the engine instead, when the hook failed


def compare_views(exchange: JsonObject, into: ClientViews | None = None) -> ClientViews:
    """The symptom checks on the client's view and on the wire answer of a capture (the
    capture's stored record), written into `into` when given (the observation's facts)."""
    request = exchange.get("request") or {}
    status = exchange.get("status") if isinstance(exchange.get("status"), int) else 200
    client, wire = exchange.get("response"), exchange.get("wire_response")
    out: ClientViews = {} if into is None else into
    out["has_client_view"] = isinstance(wire, dict)
    if isinstance(client, dict):
        failed, kinds = classify_reply(request, status, client, 0.0)
        out["captured_failed"], out["captured_kinds"] = failed, kinds
    if isinstance(wire, dict):
        failed, kinds = classify_reply(request, status, wire, 0.0)
        out["wire_failed"], out["wire_kinds"] = failed, kinds
        out["signature"] = client_signature(wire, client)
    return out


def _stream_body(request: JsonObject, seed: int) -> JsonObject:
    body = probes.replay_body(request, seed)
    body.pop("verbose", None)  # the client's stream, as it would see it
    return body


async def _streamed(ctx: ObserveContext, signature: str, kinds: set[str]) -> StreamedReplays:
    """Paired streamed replays: the server's answer vs the client's view of it."""
    client = llama_client.LlamaClient(
        ctx.server.base_url, timeout=ctx.timeout, api_key=ctx.server.api_key
    )
    server_fail = client_fail = fixed = errors = 0
    n, decision, p_value = 0, "undecided", None
    try:
        for target in STREAM_LOOKS:
            while n + errors < target:
                index = n + errors
                body = _stream_body(ctx.request, ctx.seed + index)
                try:
                    result = await client.chat_stream(body)
                except LlamaClientError:
                    errors += 1
                    continue
                message: JsonObject = {"role": "assistant", "content": result.content}
                if result.reasoning_content:
                    message["reasoning_content"] = result.reasoning_content
                if result.tool_calls:
                    message["tool_calls"] = result.tool_calls
                answer = {
                    "object": "chat.completion",
                    "choices": [
                        {"index": 0, "message": message, "finish_reason": result.finish_reason}
                    ],
                }
                status = result.status_code
                s_failed, _ = classify_reply(body, status, answer, result.elapsed)
                c_failed, c_kinds = classify_reply(
                    body, status, apply_signature(signature, answer), result.elapsed
                )
                c_failed = c_failed and (not kinds or bool(kinds & set(c_kinds)))
                n += 1
                server_fail += s_failed
                client_fail += c_failed
                fixed += c_failed and not s_failed
            cmp = compare(
                client_fail,
                n,
                server_fail,
                n,
                looks=len(STREAM_LOOKS),
                paired=(client_fail, fixed),
            )
            decision, p_value = cmp.decision, cmp.p_less
            if decision in ("removes", "unchanged", "no-baseline-failure"):
                break
    finally:
        await client.aclose()
    return {
        "n": n,
        "errors": errors,
        "server_failures": server_fail,
        "client_failures": client_fail,
        "decision": decision,
        "p_value": p_value,
    }


async def observe(ctx: ObserveContext) -> ClientViewFacts:
    facts: ClientViewFacts = {
        "name": ARM,
        "dropped_flags": dropped_thinking_flags(ctx.request),
        "has_capture": bool(ctx.exchange),
        "has_client_view": False,
    }
    if ctx.exchange:
        compare_views(ctx.exchange, into=facts)
    signature = facts.get("signature")
    if (
        facts["has_client_view"]
        and facts.get("captured_failed")
        and not facts.get("wire_failed")
        and signature
    ):
        kinds = set(facts.get("captured_kinds") or [])
        facts["streamed"] = await _streamed(ctx, str(signature), kinds)
    facts["summary"] = _summary(facts)
    return facts


def _summary(facts: ClientViewFacts) -> str:
    parts = []
    if facts["dropped_flags"]:
        flags = ", ".join(facts["dropped_flags"])
        parts.append(f"thinking-off never reached the template: {flags}")
    if facts["has_client_view"]:
        parts.append(
            f"client view {'fails' if facts.get('captured_failed') else 'passes'} "
            f"({', '.join(facts.get('captured_kinds') or []) or 'no finding'}), wire answer "
            f"{'fails' if facts.get('wire_failed') else 'passes'}; "
            f"client signature: {facts.get('signature') or 'none matched'}"
        )
    streamed = facts.get("streamed")
    if streamed:
        parts.append(
            f"streamed replays: server {streamed['server_failures']}/{streamed['n']}, "
            f"through the client {streamed['client_failures']}/{streamed['n']} "
            f"({streamed['decision']})"
        )
    return "; ".join(parts) or "no client evidence in the capture"


class ClientView:
    """Observation-only arm: planned for every run (the hook sends no request unless the
    capture holds a consistent client view)."""

    id, level, order = ARM, "request", 95

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        return PlannedArm(
            ARM,
            "the capture's client view vs the server's streamed answers",
            "request",
            ("client-handling",),
            observe=observe,
            when="observe",
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ClientView())
