"""The `cache-as-client` observation: the failing request replayed with llama-server's prompt
cache as the client had it -- on (the default), the prompt restored from the slot's cache --
against the baseline, whose replays all send `cache_prompt: false`.

A cache bug on restore (a checkpoint restored wrong, a reused prefix that changes the reply)
fails only when the cache is used, so the baseline cannot reproduce it. An observation-only
arm (`when = "observe"`), planned for every run; its hook sends nothing unless the client
left the cache on and the captured reply fails (the symptom checks on the capture). Then it
sends the request once to fill slot 0 (`id_slot`), and up to MAX_REPLAYS replays on that slot
with `cache_prompt: true` (each one restores the prompt the one before left there), the
seeds the baseline uses; it stops after the first look when none fails. The cause rule
compares these k/n with the baseline's (cache off): see triage/engine/causes/prompt_cache.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage import probes
from triage.engine.arms.slot_replay import slot_replayer
from triage.engine.replayer import classify_reply
from triage.llama.client import LlamaClientError
from triage.probes import ObserveContext, PlannedArm
from triage.stackfile import Stack

__all__ = ["ARM", "FIRST_LOOK", "MAX_REPLAYS", "CacheAsClient", "captured_failed", "register"]

ARM = "cache-as-client"
CAUSE = "prompt-cache"
FIRST_LOOK = 4  # replays before giving up when none fails
MAX_REPLAYS = 8
MAX_ERRORS = 4


class CacheOnFacts(TypedDict):
    """The cache-on replays as stored in the observation's facts."""

    n: int
    failures: int
    errors: int
    kinds: dict[str, int]
    cache_n: list[int]


def captured_failed(exchange: JsonObject | None) -> bool:
    """Does the captured reply fail the user-facing symptom checks?"""
    if not exchange or not isinstance(exchange.get("request"), dict):
        return False
    status = exchange.get("status") if isinstance(exchange.get("status"), int) else 200
    failed, _ = classify_reply(exchange["request"], status, exchange.get("response"), 0.0)
    return failed


def _cached_body(request: JsonObject, seed: int) -> JsonObject:
    body = probes.replay_body(request, seed)
    body.update(cache_prompt=True, id_slot=0)
    body.pop("verbose", None)
    return body


async def _replays(ctx: ObserveContext) -> CacheOnFacts:
    n = failures = errors = 0
    cached: list[int] = []
    kinds: Counter[str] = Counter()
    async with slot_replayer(ctx) as replayer:
        await replayer.send(_cached_body(ctx.request, ctx.seed - 1))  # fills the slot
        while n < MAX_REPLAYS and errors < MAX_ERRORS:
            if n == FIRST_LOOK and failures == 0:
                break
            try:
                reply = await replayer.send(_cached_body(ctx.request, ctx.seed + n))
            except LlamaClientError:
                errors += 1
                continue
            result = reply.result
            failed, found = classify_reply(
                reply.body, result.status_code, result.json, result.elapsed
            )
            if reply.cache_n is not None:
                cached.append(reply.cache_n)
            n += 1
            failures += failed
            if failed:
                kinds.update(found)
    return {
        "n": n,
        "failures": failures,
        "errors": errors,
        "kinds": dict(kinds.most_common(6)),
        "cache_n": cached,
    }


async def observe(ctx: ObserveContext) -> dict[str, Any]:
    """The hook (see the module docstring)."""
    facts: dict[str, Any] = {"name": ARM, "ran": False}
    if ctx.request.get("cache_prompt") is False:
        facts["summary"] = "the client turned the prompt cache off"
        return facts
    if not captured_failed(ctx.exchange):
        facts["summary"] = "no captured reply that fails"
        return facts
    try:
        facts.update(await _replays(ctx), ran=True)
    except LlamaClientError as exc:
        facts["error"] = f"the cache-as-client replays failed: {exc}"
        return facts
    facts["summary"] = (
        f"cache on (restored from slot 0): {facts['failures']}/{facts['n']} replays fail"
    )
    return facts


class CacheAsClient:
    """Observation-only arm, planned for every run (the hook decides whether to send)."""

    id, level, order = ARM, "request", 98

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        return PlannedArm(
            ARM,
            "the request with the prompt cache on, restored from one slot (vs the cache-off "
            "baseline)",
            "request",
            (CAUSE,),
            observe=observe,
            when="observe",
        )


def register(catalogue: Any) -> None:
    catalogue.arms.add(CacheAsClient())
