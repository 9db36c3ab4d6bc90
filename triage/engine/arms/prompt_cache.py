"""The `prompt-cache-turns` observation: the captured conversation replayed turn by turn on one
slot with the prompt cache on, as clients have it -- once with the value that begins to
change every turn re-rendered per turn (as the client's clock or id generator does it), once
with it held fixed -- each turn's `timings.cache_n` and `prompt_ms` read back.

Every other replay sends `cache_prompt: false` (triage.probes.replay_body: a replicate must
not depend on the one before it), so no cache behaviour can show there. An observation-only
arm (`when = "observe"`), planned for every run; its hook sends nothing unless:

* the request continues a conversation (at least two user turns, an assistant turn between),
  and the client did not turn the cache off (`cache_prompt: false`);
* the first message holds a value that changes every turn when a client renders it (a
  timestamp, a date, a clock time, a UUID, an epoch number: `volatile_value`); its JSON path
  and character offset are recorded -- the cache reuses at most the prompt before it.

Then it replays turns 1..T (the messages up to each user turn, T at most MAX_TURNS) on slot 0
(`id_slot`), `max_tokens` 1 (only the prompt's evaluation matters), in rounds until at least
MIN_PAIRS later turns are measured both ways (`as-client` then `held` each round). A turn
"reuses nothing" when the cache gives back less than UNSTABLE_CACHED_SHARE of its prompt
(the unstable-prefix finding's reading); the two ways are compared with the engine's test
(triage.stats.compare, one look). The captured reply's own `timings` (cache_n against
prompt_n) are read too: the client's turn is the failure being explained.
"""

from __future__ import annotations

import copy
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage.checks.prefix import UNSTABLE_CACHED_SHARE
from triage.engine.arms.slot_replay import SlotReplayer, slot_replayer
from triage.llama.client import LlamaClientError
from triage.probes import ObserveContext, PlannedArm
from triage.stackfile import Stack
from triage.stats import compare

__all__ = [
    "ARM",
    "CAUSE",
    "MAX_TURNS",
    "MIN_PAIRS",
    "PromptCacheTurns",
    "Volatile",
    "captured_cache",
    "register",
    "turn_requests",
    "user_turns",
    "varied",
    "volatile_value",
]

ARM = "prompt-cache-turns"
CAUSE = "prompt-cache"
MAX_TURNS = 6  # user turns replayed per sequence (the last ones of a longer conversation)
MIN_PAIRS = 8  # later turns measured both ways before the comparison
MAX_ROUNDS = 8
MAX_SCAN_CHARS = 20_000  # characters of the first message searched for a volatile value
# What a client re-renders every turn, most specific first (the earliest match wins).
VOLATILE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timestamp",
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        ),
    ),
    (
        "uuid",
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
    ),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|\s?[AaPp][Mm])?\b")),
    ("epoch", re.compile(r"\b1\d{9}(?:\d{3})?\b")),
)


class VolatileFacts(TypedDict):
    """A volatile value as stored in the observation's facts."""

    kind: str
    text: str
    where: str
    offset: int


class CapturedTimings(TypedDict):
    """The captured reply's prompt timings."""

    cache_n: int
    prompt_n: int
    prompt_ms: float | None


class WayFacts(TypedDict):
    """The later turns of one way of replaying, as stored."""

    n: int
    reuse_nothing: int
    cache_n: list[int]
    median_cache_n: float | None
    median_prompt_ms: float | None


class ReplayFacts(TypedDict):
    """The turn-by-turn replay, both ways, and their comparison."""

    turns: int
    rounds: int
    as_client: WayFacts
    held: WayFacts
    decision: str
    p_value: float | None


@dataclass(frozen=True)
class Volatile:
    """A value in the first message that a client renders anew every turn."""

    kind: str
    text: str
    where: str  # JSON path of the field
    offset: int  # character offset in it

    def to_dict(self) -> VolatileFacts:
        return {"kind": self.kind, "text": self.text, "where": self.where, "offset": self.offset}


def user_turns(request: JsonObject) -> list[int]:
    """Indices of the user messages of a chat request."""
    messages = request.get("messages")
    return [
        i
        for i, m in enumerate(messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and m.get("role") == "user"
    ]


def _continuation(request: JsonObject) -> bool:
    messages = request.get("messages")
    turns = user_turns(request)
    if len(turns) < 2 or not isinstance(messages, list):
        return False
    return any(
        isinstance(m, dict) and m.get("role") == "assistant" for m in messages[turns[0] : turns[-1]]
    )


def volatile_value(request: JsonObject) -> Volatile | None:
    """The earliest value in the first message's text that a client renders anew every turn
    (a timestamp, UUID, date, clock time or epoch number), or None."""
    messages = request.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    content = first.get("content") if isinstance(first, dict) else None
    if not isinstance(content, str):
        return None
    text = content[:MAX_SCAN_CHARS]
    found: Volatile | None = None
    for kind, pattern in VOLATILE_PATTERNS:
        match = pattern.search(text)
        if match and (found is None or match.start() < found.offset):
            found = Volatile(kind, match.group(), "$.messages[0].content", match.start())
    return found


def varied(request: JsonObject, volatile: Volatile, turn: int) -> JsonObject:
    """The request with the volatile value re-rendered for `turn` (its last digit moved on by
    `turn`, so every turn's value differs and keeps its shape)."""
    body = copy.deepcopy(request)
    text = volatile.text
    for position in range(len(text) - 1, -1, -1):
        if text[position].isdigit():
            digit = str((int(text[position]) + turn) % 10)
            text = text[:position] + digit + text[position + 1 :]
            break
    content = body["messages"][0]["content"]
    start = volatile.offset
    body["messages"][0]["content"] = content[:start] + text + content[start + len(volatile.text) :]
    return body


def turn_requests(request: JsonObject) -> list[JsonObject]:
    """The conversation's turns: each the messages up to one user turn (the last MAX_TURNS),
    the cache on, one token to generate, pinned to slot 0."""
    messages = request.get("messages") or []
    out = []
    for end in user_turns(request)[-MAX_TURNS:]:
        body = {
            key: copy.deepcopy(value)
            for key, value in request.items()
            if key in ("tools", "tool_choice", "chat_template_kwargs", "model")
        }
        body.update(
            messages=copy.deepcopy(messages[: end + 1]),
            max_tokens=1,
            temperature=0.0,
            cache_prompt=True,
            id_slot=0,
            stream=False,
        )
        out.append(body)
    return out


def captured_cache(exchange: JsonObject | None) -> CapturedTimings | None:
    """The captured reply's prompt timings: cached and evaluated tokens, prompt ms."""
    response = (exchange or {}).get("response")
    timings = response.get("timings") if isinstance(response, dict) else None
    if not isinstance(timings, dict):
        return None
    cached, evaluated = timings.get("cache_n"), timings.get("prompt_n")
    if not isinstance(cached, int) or not isinstance(evaluated, int):
        return None
    spent = timings.get("prompt_ms")
    prompt_ms = float(spent) if isinstance(spent, (int, float)) else None
    return {"cache_n": cached, "prompt_n": evaluated, "prompt_ms": prompt_ms}


@dataclass
class _Way:
    """The later turns of one way of replaying: cache share, cache_n and prompt ms each."""

    shares: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    prompt_ms: list[float] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(share < UNSTABLE_CACHED_SHARE for share in self.shares)

    def facts(self) -> WayFacts:
        return {
            "n": len(self.shares),
            "reuse_nothing": self.failures,
            "cache_n": self.cached,
            "median_cache_n": statistics.median(self.cached) if self.cached else None,
            "median_prompt_ms": (
                round(statistics.median(self.prompt_ms), 1) if self.prompt_ms else None
            ),
        }


async def _sequence(replayer: SlotReplayer, turns: list[JsonObject], way: _Way) -> None:
    for index, body in enumerate(turns):
        reply = await replayer.send(body)
        if not reply.result.ok or reply.cache_n is None or reply.prompt_n is None:
            raise LlamaClientError(
                f"turn {index + 1}: HTTP {reply.result.status_code}, no timings",
                kind="http",
                url="",
            )
        if index == 0:
            continue  # the first turn has nothing of this sequence to reuse
        way.shares.append(reply.cached_share)
        way.cached.append(reply.cache_n)
        way.prompt_ms.append(reply.prompt_ms or 0.0)


async def _replay(ctx: ObserveContext, volatile: Volatile) -> ReplayFacts:
    turns = turn_requests(ctx.request)
    as_client, held = _Way(), _Way()
    rounds = 0
    async with slot_replayer(ctx) as replayer:
        while len(held.shares) < MIN_PAIRS and rounds < MAX_ROUNDS:
            rounds += 1
            stamped = [
                varied(body, volatile, rounds * len(turns) + i) for i, body in enumerate(turns)
            ]
            await _sequence(replayer, stamped, as_client)
            await _sequence(replayer, turns, held)
    n = min(len(as_client.shares), len(held.shares))
    cmp = compare(as_client.failures, n, held.failures, n, looks=1) if n else None
    return {
        "turns": len(turns),
        "rounds": rounds,
        "as_client": as_client.facts(),
        "held": held.facts(),
        "decision": cmp.decision if cmp else "undecided",
        "p_value": cmp.p_less if cmp else None,
    }


async def observe(ctx: ObserveContext) -> dict[str, Any]:
    """The hook (see the module docstring)."""
    request = ctx.request
    facts: dict[str, Any] = {
        "name": ARM,
        "continuation": _continuation(request),
        "cache_off": request.get("cache_prompt") is False,
        "captured": captured_cache(ctx.exchange),
        "volatile": None,
    }
    if not facts["continuation"] or facts["cache_off"]:
        facts["summary"] = "no conversation to replay turn by turn with the cache on"
        return facts
    volatile = volatile_value(request)
    if volatile is None:
        facts["summary"] = "no value that changes every turn in the first message"
        return facts
    facts["volatile"] = volatile.to_dict()
    try:
        facts["replay"] = await _replay(ctx, volatile)
    except LlamaClientError as exc:
        facts["error"] = f"the turn-by-turn replay failed: {exc}"
        return facts
    replay = facts["replay"]
    facts["summary"] = (
        f"{volatile.kind} {volatile.text!r} at {volatile.where} char {volatile.offset}: "
        f"re-rendered per turn {replay['as_client']['reuse_nothing']}/"
        f"{replay['as_client']['n']} later turns reuse nothing (median cache_n "
        f"{replay['as_client']['median_cache_n']}), held "
        f"{replay['held']['reuse_nothing']}/{replay['held']['n']} (median cache_n "
        f"{replay['held']['median_cache_n']})"
    )
    return facts


class PromptCacheTurns:
    """Observation-only arm, planned for every run (the hook decides whether to send)."""

    id, level, order = ARM, "request", 97

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        return PlannedArm(
            ARM,
            "the conversation turn by turn on one slot, cache on: the value that changes "
            "every turn re-rendered vs held",
            "request",
            (CAUSE,),
            observe=observe,
            when="observe",
        )


def register(catalogue: Any) -> None:
    catalogue.arms.add(PromptCacheTurns())
