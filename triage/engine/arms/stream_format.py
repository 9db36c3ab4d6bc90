"""The `stream-vs-nonstream` observation: the same request streamed and not streamed, paired
by seed, each streamed reply validated per delta against the OpenAI chunk format.

An observation-only arm (`when = "observe"`): the scheduler's baseline replays are never
streamed, so a failure that lives in the stream's format cannot reproduce there. Planned for
every run; its hook sends nothing unless the client streamed (`stream: true` in the request;
`streamed: false` in its facts otherwise). Then, on the server the client talked to (the
stack's `[gateway]` when it has one, else the incident's server), it:

* reads the capture: how many `stream-format-violation`s its stream holds (a capture whose
  stream is well formed sends nothing more: the format did not break what the client saw);
* otherwise sends pairs -- the request streamed and the same request with `stream: false`,
  one seed per pair -- looked at after 8, 16 and 32 pairs: a streamed reply fails when the
  strict per-delta validator (triage/capture/stream_format.py, the same one captures go
  through) reports a violation; a non-streamed reply fails when the symptom checks fail it.
  The two rates are compared with the engine's sequential rule on the pairs (never from one
  sample). It also counts the pairs whose answers agree (the stream, re-assembled leniently,
  carries the same content and tool calls as the non-streamed reply: the answer was right,
  only its deltas were malformed);
* behind a gateway, when the streams through it break the format, the same request streamed
  direct to llama-server (up to 8 replays) says who breaks it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage import probes
from triage.capture import CaptureError, exchange_from_http
from triage.capture.stream_format import STREAM_FORMAT_KEY
from triage.engine.replayer import classify_reply
from triage.llama.client import LlamaClient, LlamaClientError
from triage.probes import ObserveContext, PlannedArm
from triage.stackfile import Stack
from triage.stats import compare

__all__ = [
    "ARM",
    "CAUSE",
    "DIRECT_REPLAYS",
    "KIND",
    "PAIR_LOOKS",
    "StreamVsNonStream",
    "captured_violations",
    "register",
    "streamed_request",
]

ARM = "stream-vs-nonstream"
CAUSE = "stream-format"
KIND = "stream-format-violation"
PAIR_LOOKS = (8, 16, 32)  # pairs (streamed, non-streamed), looked at after each
DIRECT_REPLAYS = 8  # streamed replays direct to llama-server, behind a gateway
MAX_ERRORS = 8  # replays that got no answer at all before the observation gives up


def streamed_request(request: JsonObject) -> bool:
    """Did the client ask for a stream?"""
    return request.get("stream") is True


def _violations_of(response: Any) -> list[JsonObject]:
    record = response.get(STREAM_FORMAT_KEY) if isinstance(response, dict) else None
    if not isinstance(record, dict):
        return []
    items = record.get("violations")
    return [v for v in items if isinstance(v, dict)] if isinstance(items, list) else []


def captured_violations(exchange: JsonObject | None) -> list[JsonObject] | None:
    """The captured stream's violations (the wire stream's too, for a client-view capture);
    None when there is no captured reply to a streamed request to read."""
    request = (exchange or {}).get("request")
    if not exchange or not (isinstance(request, dict) and streamed_request(request)):
        return None
    responses = [exchange.get(key) for key in ("response", "wire_response")]
    if not any(isinstance(response, dict) for response in responses):
        return None
    return [v for response in responses for v in _violations_of(response)]


def _answer(message: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Content and tool calls (name, arguments re-serialised) of a reply's message."""
    if not isinstance(message, dict):
        return "", ()
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        raw = function.get("arguments")
        try:
            arguments = json.dumps(json.loads(str(raw)), sort_keys=True)
        except ValueError:
            arguments = str(raw)
        calls.append((str(function.get("name") or ""), arguments))
    return str(message.get("content") or "").strip(), tuple(calls)


def _message(response: Any) -> Any:
    try:
        return response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None


@dataclass
class _Streamed:
    """One streamed reply: failed (a violation), its violation codes, its answer."""

    failed: bool
    codes: list[str]
    answer: tuple[str, tuple[tuple[str, str], ...]] | None


async def _one_stream(client: LlamaClient, body: JsonObject) -> _Streamed:
    result = await client.chat_stream(body)
    try:
        exchange = exchange_from_http(
            {**body, "stream": True}, result.raw, status=result.status_code
        )
    except CaptureError:
        return _Streamed(False, [], None)
    violations = _violations_of(exchange.response)
    codes = [str(v.get("code", "?")) for v in violations]
    return _Streamed(bool(violations), codes, _answer(_message(exchange.response)))


class PairFacts(TypedDict):
    """The paired replays as stored in the observation's facts."""

    n: int
    errors: int
    stream_failures: int
    nonstream_failures: int
    same_answer: int
    codes: dict[str, int]
    nonstream_kinds: dict[str, int]
    decision: str
    p_value: float | None


class DirectFacts(TypedDict):
    """Streamed replays direct to llama-server (behind a gateway)."""

    n: int
    failures: int


@dataclass
class _Pairs:
    n: int = 0
    errors: int = 0
    stream_failures: int = 0
    nonstream_failures: int = 0
    fixed: int = 0  # pairs whose stream failed and whose non-streamed reply did not
    same_answer: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    nonstream_kinds: Counter[str] = field(default_factory=Counter)
    decision: str = "undecided"
    p_value: float | None = None

    def facts(self) -> PairFacts:
        return {
            "n": self.n,
            "errors": self.errors,
            "stream_failures": self.stream_failures,
            "nonstream_failures": self.nonstream_failures,
            "same_answer": self.same_answer,
            "codes": dict(self.codes.most_common(8)),
            "nonstream_kinds": dict(self.nonstream_kinds.most_common(8)),
            "decision": self.decision,
            "p_value": self.p_value,
        }


def _body(request: JsonObject, seed: int) -> JsonObject:
    body = probes.replay_body(request, seed)
    body.pop("verbose", None)  # the reply as a client sees it, streamed or not
    return body


async def _pair(client: LlamaClient, request: JsonObject, seed: int, pairs: _Pairs) -> None:
    body = _body(request, seed)
    try:
        streamed = await _one_stream(client, body)
        plain = await client.chat(body)
    except LlamaClientError:
        pairs.errors += 1
        return
    failed, kinds = classify_reply(body, plain.status_code, plain.json, plain.elapsed)
    pairs.n += 1
    pairs.stream_failures += streamed.failed
    pairs.nonstream_failures += failed
    pairs.fixed += streamed.failed and not failed
    pairs.codes.update(set(streamed.codes))
    if failed:
        pairs.nonstream_kinds.update(kinds)
    if streamed.answer is not None and streamed.answer == _answer(_message(plain.json)):
        pairs.same_answer += 1


async def _paired(ctx: ObserveContext, url: str, key: str | None) -> _Pairs:
    pairs = _Pairs()
    client = LlamaClient(url, timeout=ctx.timeout, api_key=key)
    try:
        for target in PAIR_LOOKS:
            while pairs.n < target and pairs.errors < MAX_ERRORS:
                await _pair(client, ctx.request, ctx.seed + pairs.n + pairs.errors, pairs)
            if pairs.n == 0:
                break
            cmp = compare(
                pairs.stream_failures,
                pairs.n,
                pairs.nonstream_failures,
                pairs.n,
                looks=len(PAIR_LOOKS),
                paired=(pairs.stream_failures, pairs.fixed),
            )
            pairs.decision, pairs.p_value = cmp.decision, cmp.p_less
            if cmp.decision in ("removes", "unchanged", "no-baseline-failure"):
                break
            if pairs.errors >= MAX_ERRORS:
                break
    finally:
        await client.aclose()
    return pairs


async def _direct(ctx: ObserveContext) -> DirectFacts:
    """Streamed replays direct to llama-server (the stack has a gateway in front)."""
    client = LlamaClient(ctx.base.base_url, timeout=ctx.timeout, api_key=ctx.base.api_key)
    n = failures = 0
    try:
        for index in range(DIRECT_REPLAYS):
            try:
                streamed = await _one_stream(client, _body(ctx.request, ctx.seed + index))
            except LlamaClientError:
                continue
            n += 1
            failures += streamed.failed
    finally:
        await client.aclose()
    return {"n": n, "failures": failures}


async def observe(ctx: ObserveContext) -> dict[str, Any]:
    """The hook: the capture's violations, then (unless the capture is well formed) the
    streamed vs non-streamed pairs, and behind a gateway the direct streams."""
    target = ctx.client_side or ctx.server
    through_gateway = target is not ctx.server and target.base_url != ctx.server.base_url
    if not streamed_request(ctx.request):
        return {"name": ARM, "streamed": False, "summary": "the client did not stream"}
    captured = captured_violations(ctx.exchange)
    facts: dict[str, Any] = {
        "name": ARM,
        "streamed": True,
        "captured_violations": None if captured is None else len(captured),
        "captured_codes": sorted({str(v.get("code", "?")) for v in captured or []}),
        "through_gateway": through_gateway,
    }
    if captured is not None and not captured:
        facts["summary"] = "the captured stream is well formed (0 format violations)"
        return facts
    pairs = await _paired(ctx, target.base_url, target.api_key)
    facts["pairs"] = pairs.facts()
    if through_gateway and pairs.stream_failures:
        facts["direct"] = await _direct(ctx)
    facts["summary"] = _summary(facts["pairs"], facts.get("direct"))
    return facts


def _summary(pairs: PairFacts, direct: DirectFacts | None) -> str:
    text = (
        f"streamed {pairs['stream_failures']}/{pairs['n']} with a format violation vs "
        f"stream:false {pairs['nonstream_failures']}/{pairs['n']} failing "
        f"({pairs['decision']}); same answer in {pairs['same_answer']}/{pairs['n']} pairs"
    )
    if direct:
        text += f"; direct to llama-server streamed {direct['failures']}/{direct['n']}"
    return text


class StreamVsNonStream:
    """Observation-only arm, planned for every run: the hook sends nothing unless the client
    streamed (the rules then read `streamed: false` from its facts)."""

    id, level, order = ARM, "request", 96

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        return PlannedArm(
            ARM,
            "the request streamed (each delta validated) vs stream:false, paired seeds",
            "request",
            (CAUSE,),
            observe=observe,
            when="observe",
        )


def register(catalogue: Any) -> None:
    catalogue.arms.add(StreamVsNonStream())
