"""The embedding-batch arms: an `/v1/embeddings` or `/v1/rerank` request whose input is
longer than llama-server's physical batch (triage.llama.batching).

- `embedding-inputs` (observation, no replays): each input tokenized by the incident's own
  server (`/tokenize`, specials added): the longest input's tokens, against the physical
  batch its args give.
- `ubatch-raised` (server): the incident's server with `-ub` and `-b` at least the longest
  input's measured tokens (the next power of two above it), and `-c` raised to that many
  tokens per slot when the slot's context (`/props`) is smaller -- llama-server caps the
  batch at the context. Its launch waits for the measurement (`PlannedArm.configure`);
  skipped, saying why, when the longest input already fits.
- `batch-split` (request): the same request with every input cut into pieces that fit the
  server's physical batch whatever the tokenizer (at most 3 tokens a byte), as a client can
  do without touching the server. Planned when the server's args are known.

Both decide `embedding-batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kb.jsontypes import JsonObject
from triage.llama.batching import (
    SPECIAL_TOKENS,
    flag_value,
    needs_split,
    physical_batch,
    raised_args,
    split_request,
    splittable,
)
from triage.llama.client import LlamaClient
from triage.llama.endpoints import Endpoint, endpoint_of, input_texts
from triage.probes import ObserveContext, PlannedArm, relaunchable
from triage.stackfile import ServerConfig, Stack

CAUSE = "embedding-batch"
INPUTS = "embedding-inputs"
RAISED = "ubatch-raised"
SPLIT = "batch-split"
# The largest physical batch the arm launches with: beyond it a launch is a memory risk.
MAX_UBATCH = 65536
PARALLEL_FLAGS = ("-np", "--parallel")
AUTO_SLOTS = 4  # llama-server's slots with -np -1 (auto)


def is_embedding_request(request: Mapping[str, Any]) -> bool:
    return endpoint_of(request) is not Endpoint.CHAT and bool(input_texts(request))


async def _tokens(client: LlamaClient, text: str) -> int:
    result = await client.request(
        "POST", "/tokenize", json_body={"content": text, "add_special": True}
    )
    payload = result.json if result.ok else None
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(tokens, list):
        detail = result.raw[:200].decode("utf-8", "replace")
        raise RuntimeError(f"/tokenize answered HTTP {result.status_code}: {detail}")
    return len(tokens)


async def measure_inputs(ctx: ObserveContext) -> dict[str, Any]:
    """The tokens of every input as the incident's server counts them."""
    request = ctx.request
    client = LlamaClient(ctx.base.base_url, timeout=ctx.timeout, api_key=ctx.base.api_key)
    try:
        extra = 0
        if endpoint_of(request) is Endpoint.RERANK and isinstance(request.get("query"), str):
            # The pair is encoded as BOS query EOS document EOS (b11434's format_prompt_rerank):
            # the query's and the document's tokens with specials, less the second BOS
            # (measured exact on a BOS/EOS vocabulary; one over on a CLS/SEP one, never under).
            extra = max(0, await _tokens(client, request["query"]) - 1)
        counts = [
            (len(item) if isinstance(item, list) else await _tokens(client, item)) + extra
            for item in input_texts(request)
        ]
    finally:
        await client.aclose()
    config = ctx.base.config
    # A running server given by URL alone: its -ub is not known.
    known = config.model is not None or not config.url
    longest = max(counts, default=0)
    return {
        "name": INPUTS,
        "endpoint": endpoint_of(request).path,
        "inputs": len(counts),
        "tokens": counts,
        "longest_tokens": longest,
        "longest_index": counts.index(longest) if counts else None,
        "physical_batch": physical_batch(config.args) if known else None,
    }


def _slots(args: tuple[str, ...], facts: Mapping[str, Any]) -> int:
    props = facts.get("server-props") or {}
    total = props.get("total_slots")
    if isinstance(total, int) and total > 0:
        return total
    value = flag_value(args, PARALLEL_FLAGS)
    try:
        slots = int(value) if value is not None else 1
    except ValueError:
        slots = 1
    return slots if slots > 0 else AUTO_SLOTS


def raised_config(server: ServerConfig, facts: Mapping[str, Any]) -> ServerConfig | str:
    """The incident's server with a physical batch that holds the longest measured input
    (and a slot context at least as large), or why the arm cannot matter."""
    measured = facts.get(INPUTS) or {}
    tokens = measured.get("longest_tokens")
    if not isinstance(tokens, int) or tokens <= 0:
        # A hook that raised is recorded under "<arm>-observation" with its error.
        failed = facts.get(f"{INPUTS}-observation") or {}
        why = measured.get("error") or failed.get("error") or "no measurement"
        return f"the inputs' tokens were not measured on the incident's server ({why})"
    current = physical_batch(server.args)
    if tokens <= current:
        return (
            f"the longest input ({tokens} tokens) fits the server's physical batch "
            f"({current}): a larger one cannot change anything"
        )
    size = 1 << (tokens + SPECIAL_TOKENS - 1).bit_length()
    if size > MAX_UBATCH:
        return f"the longest input ({tokens} tokens) needs a physical batch above {MAX_UBATCH}"
    slot_ctx = (facts.get("server-props") or {}).get("n_ctx_slot")
    context = None
    if not isinstance(slot_ctx, int) or slot_ctx < size:
        context = size * _slots(server.args, facts)
    return server.with_args(raised_args(server.args, size, context))


def raised_arm(server: ServerConfig, facts: Mapping[str, Any]) -> PlannedArm | str:
    """The ubatch-raised arm as it launches (raised_config), its variant naming the sizes."""
    config = raised_config(server, facts)
    if isinstance(config, str):
        return config
    tokens = (facts.get(INPUTS) or {}).get("longest_tokens")
    size = physical_batch(config.args)
    context = flag_value(config.args, ("-c", "--ctx-size"))
    raised_ctx = context != flag_value(server.args, ("-c", "--ctx-size"))
    return PlannedArm(
        RAISED,
        f"-ub/-b {size} (the longest input is {tokens} tokens)"
        + (f", -c {context} (the slot's context was smaller)" if raised_ctx else ""),
        "server",
        (CAUSE,),
        config=config,
    )


@dataclass(frozen=True)
class EmbeddingInputs:
    """Observation-only arm: the inputs' tokens on the incident's server."""

    id: str = INPUTS
    level: str = "request"
    order: int = 97
    endpoints: tuple[str, ...] = ("embeddings", "rerank")
    precondition: str = "an /v1/embeddings or /v1/rerank request"

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not is_embedding_request(request):
            return None
        return PlannedArm(
            INPUTS,
            "the inputs' tokens on the incident's server",
            "request",
            (CAUSE,),
            observe=measure_inputs,
            when="observe",
        )


def _fits(facts: Mapping[str, Any], exchange: Mapping[str, Any] | None) -> str | None:
    measured = facts.get(INPUTS) or {}
    tokens, batch = measured.get("longest_tokens"), measured.get("physical_batch")
    if isinstance(tokens, int) and isinstance(batch, int) and 0 < tokens <= batch:
        return (
            f"the longest input ({tokens} tokens) fits the server's physical batch ({batch}): "
            "splitting cannot change anything"
        )
    return None


@dataclass(frozen=True)
class UbatchRaised:
    """Server-level arm: -ub/-b (and -c when needed) raised to hold the longest input."""

    id: str = RAISED
    level: str = "server"
    order: int = 67
    endpoints: tuple[str, ...] = ("embeddings", "rerank")
    precondition: str = "an /v1/embeddings or /v1/rerank request on a server triage launches"

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not relaunchable(stack) or not is_embedding_request(request):
            return None
        server = stack.server
        # Until the inputs are measured: twice the physical batch (what check_config and a
        # crash run launch); `configure` sets the measured size before the arm launches.
        guess = min(MAX_UBATCH, 2 * physical_batch(server.args))
        return PlannedArm(
            RAISED,
            "-ub/-b at least the longest input's tokens (-c raised with them when needed)",
            "server",
            (CAUSE,),
            config=server.with_args(raised_args(server.args, guess, None)),
            configure=partial(raised_arm, server),
        )


@dataclass(frozen=True)
class BatchSplit:
    """Request-level arm: every input cut to fit the server's physical batch."""

    id: str = SPLIT
    level: str = "request"
    order: int = 58
    endpoints: tuple[str, ...] = ("embeddings", "rerank")
    precondition: str = (
        "an /v1/embeddings or /v1/rerank input that can exceed the physical batch of a server "
        "whose args are known"
    )

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not is_embedding_request(request) or (server.url and server.model is None):
            return None  # a running server's -ub is not known: no limit to split to
        limit = physical_batch(server.args)
        if not needs_split(request, limit) or not splittable(request, limit):
            return None
        return PlannedArm(
            SPLIT,
            f"every input cut into pieces that fit a physical batch of {limit} tokens",
            "request",
            (CAUSE,),
            transform=partial(split_request, limit=limit),
            requires=_fits,
        )


def register(catalogue: Any) -> None:
    catalogue.arms.add(EmbeddingInputs())
    catalogue.arms.add(UbatchRaised())
    catalogue.arms.add(BatchSplit())
