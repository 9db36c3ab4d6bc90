"""The context-shift arms: `context-shift-off` (the server with `--no-context-shift` instead
of `--context-shift`) and `max-tokens-set` (the request with a max_tokens).

Both are planned only for a request without max_tokens, the one kind of request that can
run into a context shift at all, and only when the server's args switch context shift on
(b11434's default is off: `llama-server --help` says "default: disabled"; older builds had
it on, so an explicit flag is the only thing the stack file proves); `max-tokens-set` also
for a running server given by URL, whose args are unknown and which cannot be relaunched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.engine.arms.context_size import per_slot_context
from triage.plugin_api import Registry
from triage.probes import PlannedArm, RequestArm, max_tokens_of, relaunchable
from triage.stackfile import Stack

SHIFT_ON = "--context-shift"
SHIFT_OFF = "--no-context-shift"
# max_tokens for a request that had none, when the server's per-slot context is unknown.
DEFAULT_MAX_TOKENS = 4096


def shift_enabled(args: tuple[str, ...] | list[str]) -> bool:
    """Do these args switch context shift on (the last of the two flags wins)?"""
    flags = [a for a in args if a in (SHIFT_ON, SHIFT_OFF)]
    return bool(flags) and flags[-1] == SHIFT_ON


def shift_off_args(args: tuple[str, ...] | list[str]) -> list[str]:
    return [*(a for a in args if a not in (SHIFT_ON, SHIFT_OFF)), SHIFT_OFF]


def bounded_max_tokens(args: tuple[str, ...] | list[str]) -> int:
    """What `max-tokens-set` asks for: the per-slot context (a reply can never use more
    without a context shift), else DEFAULT_MAX_TOKENS."""
    return per_slot_context(args) or DEFAULT_MAX_TOKENS


def with_max_tokens(request: JsonObject, value: int) -> JsonObject:
    body = copy.deepcopy(request)
    body["max_tokens"] = value
    return body


@dataclass(frozen=True)
class ContextShiftOff:
    id: str = "context-shift-off"
    precondition: str = "--context-shift in the server args and a request without max_tokens"
    level: str = "server"
    order: int = 57

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or max_tokens_of(request) is not None:
            return None
        if not shift_enabled(server.args):
            return None
        return PlannedArm(
            self.id,
            "server with --no-context-shift instead of --context-shift",
            self.level,
            ("context-shift",),
            config=server.with_args(shift_off_args(server.args)),
        )


@dataclass(frozen=True)
class MaxTokensSet:
    id: str = "max-tokens-set"
    precondition: str = "a request without max_tokens on a server with --context-shift (or a URL)"
    level: str = "request"
    order: int = 45

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        args = stack.server.args
        if max_tokens_of(request) is not None:
            return None
        # Where the args switch context shift on (or a running server's args are unknown);
        # with shift off the context end already bounds the reply as this max_tokens would.
        if not (shift_enabled(args) or not relaunchable(stack)):
            return None
        value = bounded_max_tokens(stack.server.args)
        arm = RequestArm(
            self.id,
            f"max_tokens = {value} (the request had none)",
            lambda body: with_max_tokens(body, value),
            ("context-shift",),
            order=self.order,
        )
        return arm.plan(stack, request)


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ContextShiftOff())
    catalogue.arms.add(MaxTokensSet())
