"""Observations that are not failure rates: what the server and template say about a request,
whether replays are deterministic, whether speculative decoding changes the committed tokens,
and what else alternate weights change (the confounder of a weights comparison).

Each observation is a typed record (a TypedDict: the engine stores it as evidence as it is,
and the cause rules read it) holding its own `name`; `observe_server` records its four under
their names into the mapping it is given.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Required, TypedDict

from kb.jsontypes import JsonObject
from triage import probes
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.endpoints import Endpoint, endpoint_of
from triage.llama.gguf_meta import read_gguf_meta


class SpeculativeProps(TypedDict, total=False):
    """What /props says about speculative decoding (empty when it says nothing)."""

    speculative_types: Any  # as /props reports it (a string, usually)
    speculative: bool


class RequestLimits(TypedDict):
    """The `request-limits` observation: the request's token limit and the slot's context."""

    name: str
    max_tokens: int | None
    n_ctx_slot: int | None


class ServerProps(SpeculativeProps):
    """The `server-props` observation: what /props says about the incident's server."""

    name: str
    build_info: Any  # as /props reports them
    model_path: Any
    chat_template_sha256: str
    total_slots: Any
    n_ctx_slot: int | None


class TemplateRender(TypedDict):
    """The `template-render` observation: the request rendered by the server's template, as
    sent and with enable_thinking=false."""

    name: str
    thinking_on: bool
    thinking_on_with_enable_thinking_false: bool
    enable_thinking_false_changes_prompt: bool
    prompt_chars: int
    prompt_tail: str


class Determinism(TypedDict):
    """The `determinism` observation: the same replay twice (temperature 0, fixed seed)."""

    name: str
    identical: bool
    first_divergence: int | None  # the first differing character
    chars: list[int]


class ObservationError(TypedDict):
    """An observation the server could not answer (`error`: why)."""

    name: str
    error: str


ServerObservation = ServerProps | RequestLimits | TemplateRender | Determinism | ObservationError


class SpecDivergence(TypedDict):
    """The `spec-divergence` observation: committed streams with and without speculative
    decoding at fixed seeds."""

    name: str
    seeds: int  # seeds compared (both replies in)
    diverged: int
    first_positions: list[int]  # per diverging seed: the first differing token (or char)
    temperature: Any  # the request's, as sent


class WeightsConfounder(TypedDict, total=False):
    """The `weights-confounder` observation: what else the alternate weights change. Built
    up in the order it is stored: `thinking_on` and `differs` are always there in the end."""

    name: Required[str]
    errors: list[str]  # files that could not be read
    quantization: list[str | None]  # incident's, alternate's
    chat_template_sha256: list[str | None]
    thinking_on: list[bool | None]  # thinking by default in the template render, per server
    differs: list[str]
    conversion_differs: list[str]  # added by the alt-weights arm (gguf_diff)


def message_of(body: Any) -> JsonObject:
    try:
        return dict(body["choices"][0].get("message") or {})
    except (KeyError, IndexError, TypeError, AttributeError):
        return {}


def finish_reason_of(body: Any) -> str | None:
    try:
        reason = body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


def raw_misplaced(body: Any) -> bool:
    """The raw generated text holds a tool call that the parsed message does not."""
    if not isinstance(body, dict):
        return False
    raw = str((body.get("__verbose") or {}).get("content", "") or "")
    message = message_of(body)
    markup = ("<|tool_call>", "<tool_call>")
    if not any(m in raw for m in markup):
        return False
    return not message.get("tool_calls")


def committed_text(body: Any) -> str:
    message = message_of(body)
    parts = [str(message.get("reasoning_content") or ""), str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(f"{function.get('name')}({function.get('arguments')})")
    return "\x1e".join(parts)


def first_divergence(a: str, b: str) -> int | None:
    if a == b:
        return None
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def speculative_props(props: Any) -> SpeculativeProps:
    """What /props says about speculative decoding (`speculative.types`, b11434: "none"
    unless a speculative type is configured); `speculative` is True only when it names one.
    A draft model alone shows only in the replies' `timings.draft_n` (the engine reads both)."""
    params: Any = {}
    if isinstance(props, dict):
        params = (props.get("default_generation_settings") or {}).get("params") or {}
    if not isinstance(params, dict):
        return {}
    nested = params.get("speculative")
    types = params.get("speculative.types")
    if types is None and isinstance(nested, dict):
        types = nested.get("types")
    if types is None:
        return {}
    named = [t for t in str(types).replace(";", ",").split(",") if t.strip() not in ("", "none")]
    return {"speculative_types": types, "speculative": bool(named)}


def _n_ctx(props: Any) -> int | None:
    """The per-slot context /props reports (default_generation_settings.n_ctx)."""
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _items(value: object) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple, dict)) else []


def observation_summary(name: str, facts: Mapping[str, object]) -> str:
    """One line for an observation's facts (any observation's: a plugin's too)."""
    if facts.get("error"):
        return f"{name}: error: {facts['error']}"
    if name == "template-render":
        return (
            f"template render: thinking {'ON' if facts.get('thinking_on') else 'off'} by "
            f"default for this request; with enable_thinking=false: "
            f"{'ON' if facts.get('thinking_on_with_enable_thinking_false') else 'off'}"
        )
    if name == "determinism":
        return "determinism (temperature 0, fixed seed, cache_prompt false, twice): " + (
            "identical"
            if facts.get("identical")
            else f"differ at char {facts.get('first_divergence')}"
        )
    if name == "spec-divergence":
        return (
            f"speculative vs plain decoding at fixed seeds: streams diverged in "
            f"{facts.get('diverged')}/{facts.get('seeds')} seeds"
            + (
                f", first at token {min(_items(facts['first_positions']))}"
                if facts.get("first_positions")
                else ""
            )
        )
    if name == "weights-confounder":
        differs = _items(facts.get("differs"))
        return (
            "alternate weights differ from the incident's in: " + ", ".join(differs)
            if differs
            else "alternate weights: same chat template and thinking default "
            f"(quantization {facts.get('quantization')})"
        )
    if name == "known-good-search":
        return (
            f"known-good search over {sorted(_items(facts.get('dimensions', {})))}: needed to "
            f"reproduce: {facts.get('needed_to_reproduce') or 'none isolated'}"
        )
    if name == "server-props":
        return f"server props: build {facts.get('build_info')}, slots {facts.get('total_slots')}"
    if facts.get("summary"):
        return str(facts["summary"])[:500]
    return f"{name}: {json.dumps(facts, default=str)[:200]}"


def request_limits(request: JsonObject, props: Any) -> RequestLimits:
    """The request's token limit against the slot's context (/props `n_ctx`)."""
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return {
        "name": "request-limits",
        "max_tokens": probes.max_tokens_of(request),
        "n_ctx_slot": n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else None,
    }


async def observe_server(
    server: Any,
    request: JsonObject,
    observations: MutableMapping[str, ServerObservation],
    *,
    seed: int,
    timeout: float,
) -> None:
    """Server props, the template render of the request, and a determinism check."""
    client = LlamaClient(server.base_url, timeout=timeout, api_key=getattr(server, "api_key", None))
    try:
        try:
            props = await client.props()
            slots = props.get("total_slots") if isinstance(props, dict) else None
            if isinstance(slots, int) and slots > 0:
                server.slots = slots
            template = str(props.get("chat_template", "")) if isinstance(props, dict) else ""
            observations["server-props"] = {
                "name": "server-props",
                "build_info": props.get("build_info") if isinstance(props, dict) else None,
                "model_path": props.get("model_path") if isinstance(props, dict) else None,
                "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
                "total_slots": slots,
                "n_ctx_slot": _n_ctx(props),
                **speculative_props(props),
            }
            observations["request-limits"] = request_limits(request, props)
        except LlamaClientError as exc:
            observations["server-props"] = {"name": "server-props", "error": str(exc)}
        if endpoint_of(request) is not Endpoint.CHAT:
            return  # an embeddings/rerank request renders no chat template, generates no text
        try:
            rendered = await client.apply_template(probes.template_body(request))
            off = await client.apply_template(probes.template_body(probes.thinking_off(request)))
            prompt, prompt_off = str(rendered), str(off)
            observations["template-render"] = {
                "name": "template-render",
                "thinking_on": probes.thinking_on_in_prompt(prompt),
                "thinking_on_with_enable_thinking_false": probes.thinking_on_in_prompt(prompt_off),
                "enable_thinking_false_changes_prompt": prompt != prompt_off,
                "prompt_chars": len(prompt),
                "prompt_tail": prompt[-300:],
            }
        except LlamaClientError as exc:
            observations["template-render"] = {"name": "template-render", "error": str(exc)}
        # Determinism: temperature 0, fixed seed, no prompt cache, twice.
        body = probes.replay_body(request, seed)
        body["temperature"] = 0
        texts = []
        # With the server's pace (triage.engine.pacing), these two replies are also its
        # first speed measurement, and a slow server is waited for while it progresses.
        # Imported here: triage.engine (its package __init__ loads the runner) imports this
        # module, so a top-level import would close a circle.
        from triage.engine.pacing import ReplayTimeout, timed_chat

        pace = getattr(server, "pace", None)
        for _ in range(2):
            try:
                if pace is not None:
                    result = await timed_chat(client, copy.deepcopy(body), pace)
                else:
                    result = await client.chat(copy.deepcopy(body))
                texts.append(committed_text(result.json))
            except (LlamaClientError, ReplayTimeout) as exc:
                texts.append(f"error: {exc}")
        observations["determinism"] = {
            "name": "determinism",
            "identical": texts[0] == texts[1],
            "first_divergence": first_divergence(texts[0], texts[1]),
            "chars": [len(t) for t in texts],
        }
    finally:
        await client.aclose()


async def spec_divergence(
    spec_server: Any,
    plain_server: Any,
    request: JsonObject,
    *,
    seed: int,
    seeds: int,
    timeout: float,
) -> SpecDivergence:
    """Committed token streams with and without speculative decoding at fixed seeds."""
    clients = [
        LlamaClient(s.base_url, timeout=timeout, api_key=getattr(s, "api_key", None))
        for s in (spec_server, plain_server)
    ]
    compared, diverged, positions = 0, 0, []
    try:
        for offset in range(seeds):
            body = probes.replay_body(request, seed + 10_000 + offset)
            try:
                a, b = [await c.chat(copy.deepcopy(body)) for c in clients]
            except LlamaClientError:
                continue
            compared += 1
            ta, tb = committed_text(a.json), committed_text(b.json)
            if ta != tb:
                diverged += 1
                char = first_divergence(ta, tb) or 0
                token = None
                try:
                    tokens = await clients[1].tokenize(ta[:char])
                    token = len(tokens) if isinstance(tokens, list) else None
                except LlamaClientError:
                    pass
                positions.append(token if token is not None else char)
    finally:
        for client in clients:
            await client.aclose()
    return {
        "name": "spec-divergence",
        "seeds": compared,
        "diverged": diverged,
        "first_positions": positions,
        "temperature": request.get("temperature"),
    }


async def weights_confounder(
    incident_server: Any, alt_server: Any, request: JsonObject, *, timeout: float
) -> WeightsConfounder:
    """What else differs between the incident weights and the alternate weights."""
    facts: WeightsConfounder = {"name": "weights-confounder"}
    differs: list[str] = []
    metas: list[Any] = []
    for path in (incident_server.config.model, alt_server.config.model):
        try:
            metas.append(read_gguf_meta(Path(str(path))))
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            metas.append(None)
            facts.setdefault("errors", []).append(f"{path}: {exc}")
    if all(metas):
        a, b = metas
        facts["quantization"] = [a.quantization, b.quantization]
        facts["chat_template_sha256"] = [a.chat_template_sha256, b.chat_template_sha256]
        if a.chat_template_sha256 != b.chat_template_sha256:
            differs.append("the chat template")
    thinking: list[bool | None] = []
    for server in (incident_server, alt_server):
        client = LlamaClient(
            server.base_url, timeout=timeout, api_key=getattr(server, "api_key", None)
        )
        try:
            rendered = await client.apply_template(probes.template_body(request))
            thinking.append(probes.thinking_on_in_prompt(str(rendered)))
        except LlamaClientError:
            thinking.append(None)
        finally:
            await client.aclose()
    facts["thinking_on"] = thinking
    if None not in thinking and thinking[0] != thinking[1]:
        differs.append("the thinking default")
    facts["differs"] = differs
    return facts
