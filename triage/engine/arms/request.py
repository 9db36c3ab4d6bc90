"""The request-level arms: thinking off, `/no_think`, a reasoning budget, and the token
limit lifted to the slot's context."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.engine.arms.context_size import per_slot_context
from triage.llama.gguf_meta import read_gguf_meta
from triage.plugin_api import Registry
from triage.probes import (
    THINKING_PRECONDITION,
    PlannedArm,
    RequestArm,
    max_tokens_of,
    no_think_suffix,
    reasoning_budget,
    requires_thinking,
    thinking_off,
)
from triage.stackfile import Stack

LIFTED = "token-limit-lifted"
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")

ARMS = (
    RequestArm(
        "thinking-off",
        "chat_template_kwargs.enable_thinking=false",
        thinking_off,
        ("reasoning-exhausts-budget", "token-limit", "output-parsing", "structured-output"),
        order=10,
        precondition=THINKING_PRECONDITION,
        requires=requires_thinking,
    ),
    # Informational (decides no cause): the seed's own attempt; on Gemma 4 it is plain text.
    RequestArm(
        "no-think-suffix",
        "'/no_think' appended to the last user message",
        no_think_suffix,
        (),
        order=20,
        precondition=THINKING_PRECONDITION,
        requires=requires_thinking,
    ),
    RequestArm(
        "reasoning-budget",
        "reasoning_budget_tokens = max_tokens/4, max_tokens unchanged",
        reasoning_budget,
        ("reasoning-exhausts-budget",),
        order=30,
        precondition=THINKING_PRECONDITION,
        requires=requires_thinking,
    ),
)


def lift_bound(stack: Stack) -> int | None:
    """How far the limit can be lifted: the per-slot context the server's `-c / -np` give,
    else the model's trained context (what llama-server uses without `-c`), else None (a
    running server by URL: the limit is removed and the slot alone bounds the reply)."""
    slot = per_slot_context(stack.server.args)
    if slot is not None:
        return slot
    model = stack.server.model
    if model is None:
        return None
    try:
        context = read_gguf_meta(Path(str(model))).context_length
    except Exception:  # noqa: BLE001 - unreadable metadata: the slot alone bounds it
        return None
    return context if isinstance(context, int) and context > 0 else None


@dataclass(frozen=True)
class Lift:
    """The request with its token limit lifted to `bound` (None: removed)."""

    bound: int | None

    def __call__(self, request: JsonObject) -> JsonObject:
        body = copy.deepcopy(request)
        for field in LIMIT_FIELDS:
            body.pop(field, None)
        if self.bound is not None:
            body["max_tokens"] = self.bound
        return body


@dataclass(frozen=True)
class TokenLimitLifted:
    """The token limit lifted: does the reply then end on its own (finish `stop`)? Bounded
    by the slot's context, never by a multiple of the limit: a reply that needs 500 tokens
    under a 24-token limit still fails at 4x. Planned only when the request sets a limit
    below that bound (otherwise lifting it changes nothing)."""

    id: str = LIFTED
    precondition: str = "a max_tokens below the slot's context"
    level: str = "request"
    order: int = 40

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        limit = max_tokens_of(request)
        if limit is None:
            return None
        bound = lift_bound(stack)
        if bound is not None and limit >= bound:
            return None
        where = f"to the slot's context ({bound} tokens)" if bound else "(removed)"
        return PlannedArm(
            self.id,
            f"max_tokens {limit} lifted {where}",
            self.level,
            ("token-limit",),
            Lift(bound),
        )


def register(catalogue: Registry) -> None:
    for arm in ARMS:
        catalogue.arms.add(arm)
    catalogue.arms.add(TokenLimitLifted())
