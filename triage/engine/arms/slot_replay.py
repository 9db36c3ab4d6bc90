"""Replays with the prompt cache on, on one slot: what the `cache-as-client` and
`prompt-cache-turns` observations share (triage/engine/arms/cache_as_client.py,
triage/engine/arms/prompt_cache.py).

Every other replay sends `cache_prompt: false` (triage.probes.replay_body) so that no replicate
depends on the one before it; these two observations want exactly that dependence: each
request is pinned to slot 0 (`id_slot`) with `cache_prompt: true`, so it restores what the one
before it left in the slot. `SlotReplayer.send` returns the reply with its prompt timings
(`cache_n`: tokens restored from the cache, `prompt_n`: tokens evaluated, `prompt_ms`) read
back; `slot_replayer(ctx)` opens and always closes the client on the incident's server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.llama.client import ChatResult, LlamaClient
from triage.probes import ObserveContext

__all__ = ["SLOT", "SlotReply", "SlotReplayer", "slot_replayer"]

SLOT = 0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class SlotReply:
    """One reply of a cache-on replay and its prompt timings (None: not in the reply)."""

    body: JsonObject  # what was sent
    result: ChatResult
    cache_n: int | None
    prompt_n: int | None
    prompt_ms: float | None

    @property
    def cached_share(self) -> float:
        """The share of the prompt restored from the cache (0.0 without timings)."""
        cached, evaluated = self.cache_n or 0, self.prompt_n or 0
        return cached / max(1, cached + evaluated)


class SlotReplayer:
    """Sends requests with the prompt cache on, pinned to one slot."""

    def __init__(self, client: LlamaClient) -> None:
        self.client = client

    async def send(self, body: JsonObject) -> SlotReply:
        """POST the body with `cache_prompt: true` on slot SLOT (LlamaClientError: no reply)."""
        sent = {**body, "cache_prompt": True, "id_slot": SLOT}
        result = await self.client.chat(sent)
        timings = result.json.get("timings") if isinstance(result.json, dict) else None
        timings = timings if isinstance(timings, dict) else {}
        spent = timings.get("prompt_ms")
        return SlotReply(
            sent,
            result,
            _int(timings.get("cache_n")),
            _int(timings.get("prompt_n")),
            float(spent) if isinstance(spent, (int, float)) else None,
        )


@asynccontextmanager
async def slot_replayer(ctx: ObserveContext) -> AsyncIterator[SlotReplayer]:
    """A SlotReplayer on the observation's server, its client closed whatever happens."""
    client = LlamaClient(ctx.server.base_url, timeout=ctx.timeout, api_key=ctx.server.api_key)
    try:
        yield SlotReplayer(client)
    finally:
        await client.aclose()
