"""The request-level arms: thinking off, `/no_think`, a reasoning budget, max_tokens x4."""

from __future__ import annotations

from triage.probes import (
    RequestArm,
    max_tokens_of,
    no_think_suffix,
    reasoning_budget,
    thinking_off,
    token_limit_x4,
)

ARMS = (
    RequestArm(
        "thinking-off",
        "chat_template_kwargs.enable_thinking=false",
        thinking_off,
        ("reasoning-exhausts-budget", "token-limit", "output-parsing", "structured-output"),
        order=10,
    ),
    # Informational (decides no cause): the seed's own attempt; on Gemma 4 it is plain text.
    RequestArm(
        "no-think-suffix",
        "'/no_think' appended to the last user message",
        no_think_suffix,
        (),
        order=20,
    ),
    RequestArm(
        "reasoning-budget",
        "reasoning_budget_tokens = max_tokens/4, max_tokens unchanged",
        reasoning_budget,
        ("reasoning-exhausts-budget",),
        order=30,
    ),
    RequestArm(
        "token-limit-x4",
        "max_tokens x4",
        token_limit_x4,
        ("token-limit",),
        order=40,
        applies=lambda request: max_tokens_of(request) is not None,
    ),
)


def register(catalogue: object) -> None:
    for arm in ARMS:
        catalogue.arms.add(arm)  # type: ignore[attr-defined]
