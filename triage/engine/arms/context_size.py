"""context-lifted: the same server with its context (`-c`, same `-np`) lifted to what the
reply can need, plus the `context-fill` observation (per-slot n_ctx vs the tokens the failing
request used). Issue 23: a limit is probed by lifting it, not by a multiple -- a reply that
needs 500 tokens in a 64-token slot still fails at four times it.

What a reply can need, per slot: an upper bound on the prompt's tokens plus the request's
max_tokens (the reply cannot need more than the client allows), or -- without max_tokens --
an answer allowance of ANSWER_ALLOWANCE tokens; bounded by the model's trained context (the
GGUF's `<arch>.context_length`). The replies that then end on their own measure the answer's
natural length, reported against the slot ("replies need 342-554 tokens ...; the slot holds
256"). Planned only when it can matter: the server sets its context explicitly, the request
could reach the per-slot context, and the lifted slot is larger than the current one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage.llama import client as llama_client
from triage.llama.client import LlamaClientError
from triage.llama.gguf_kv import GGUFKVError, read_kv
from triage.plugin_api import Registry
from triage.probes import ObserveContext, PlannedArm, max_tokens_of, relaunchable, replay_body
from triage.stackfile import Stack

ARM = "context-lifted"
FACTS = "context-fill"
CTX_FLAGS = ("-c", "--ctx-size")
PARALLEL_FLAGS = ("-np", "--parallel")
UNIFIED_FLAGS = ("-kvu", "--kv-unified")
# Completion tokens a request without max_tokens is allowed in the lifted slot: long
# answers of small real models measured 302-1238 tokens (SmolLM2-135M, issue 23); a loop
# runs to the bound whatever it is, so it also bounds what a looping reply costs.
ANSWER_ALLOWANCE = 4096
# llama-server's auto slot count (-np -1): 4 slots.
AUTO_SLOTS = 4
# Chat-template tokens around each message (turn markers, role, newlines): generous.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS = 64
# The server stops a generation when the cache is one token from full; a reply that used
# this close to n_ctx reached the end of its slot's context.
CONTEXT_END_SLACK = 2
# The error type and message llama-server answers a prompt that does not fit with.
EXCEED_TYPE = "exceed_context_size_error"
EXCEED_TEXT = "exceeds the available context size"


class ContextPlan(TypedDict):
    """Why the context-lifted arm is (or is not) planned: `context_plan`'s numbers."""

    url_only: bool
    explicit_c: int | None
    slots: int | None
    per_slot: int | None
    prompt_bound: int | None
    max_tokens: int | None
    can_reach: bool
    trained: int | None


class ContextFill(TypedDict, total=False):
    """The `context-fill` observation (stored as evidence, read by the context-size rule):
    what one reply on the incident's server says about its slot's context, with the same
    reply on the larger-context server under `arm`. Values from the reply's JSON are kept
    as the server sent them."""

    name: str
    max_tokens: int | None
    n_ctx_slot: Any
    status: int | None
    error: str
    exceeded: bool
    prompt_tokens: Any
    completion_tokens: Any
    tokens_used: int | None
    finish_reason: Any
    truncated: Any
    reached_context: bool | None
    always_fits: bool
    arm: ContextFill
    summary: str


def flag_value(args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `-x V` / `--xx=V` among `args` for any of `names`."""
    found = None
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                found = args[index + 1]
            elif name.startswith("--") and arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def context_of(args: tuple[str, ...] | list[str]) -> int | None:
    """The explicit total context (`-c N`, N > 0) of a server's args, else None."""
    value = _int(flag_value(args, CTX_FLAGS))
    return value if value is not None and value > 0 else None


def per_slot_context(args: tuple[str, ...] | list[str]) -> int | None:
    """The smallest per-slot context these args can give (None without an explicit -c):
    `-c / -np` (a unified KV cache lets a slot use more, never less)."""
    total = context_of(args)
    if total is None:
        return None
    slots = _int(flag_value(args, PARALLEL_FLAGS))
    if slots is None or slots <= 0:
        slots = AUTO_SLOTS
    return max(1, total // slots)


def prompt_token_bound(request: JsonObject) -> int:
    """An upper bound on the prompt's tokens: at most one token per UTF-8 byte of every
    message and tool definition, plus the chat template's markup."""
    messages = request.get("messages")
    count = len(messages) if isinstance(messages, list) else 1
    body = {k: request.get(k) for k in ("messages", "tools", "functions", "prompt")}
    size = len(json.dumps(body, ensure_ascii=False).encode("utf-8"))
    return size + TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * count


def could_reach_context(args: tuple[str, ...] | list[str], request: JsonObject) -> bool:
    """Could this request reach the end of its slot's context on a server with `args`?"""
    slot = per_slot_context(args)
    if slot is None or not (request.get("messages") or request.get("prompt")):
        return False  # no context flag, or no request to judge (e.g. listing a stack's arms)
    limit = max_tokens_of(request)
    return limit is None or prompt_token_bound(request) + limit >= slot


def context_plan(stack: Stack, request: JsonObject) -> ContextPlan:
    """Why the context-lifted arm is (or is not) planned for this stack and request, with the
    numbers: the explicit -c, slots, per-slot context, the prompt's token bound and
    max_tokens. Read by the context-size rule to say which reason holds."""
    args = list(stack.server.args)
    slots = _int(flag_value(args, PARALLEL_FLAGS))
    return {
        "url_only": not relaunchable(stack),
        "explicit_c": context_of(args),
        "slots": slots if slots is not None and slots > 0 else None,
        "per_slot": per_slot_context(args),
        "prompt_bound": prompt_token_bound(request) if request.get("messages") else None,
        "max_tokens": max_tokens_of(request),
        "can_reach": could_reach_context(args, request),
        "trained": trained_context(stack.server.model),
    }


def unplanned_reason(plan: ContextPlan, n_ctx_props: object = None) -> str:
    """Which reason kept the context-lifted arm out of the plan, said with its numbers
    (`plan`: context_plan; `n_ctx_props`: the per-slot n_ctx the server's /props reports)."""
    props = (
        f"; its /props reports a {n_ctx_props}-token slot context"
        if isinstance(n_ctx_props, int) and not isinstance(n_ctx_props, bool)
        else ""
    )
    if plan.get("url_only"):
        return (
            "the stack names a running server by URL, and triage cannot relaunch it with a "
            f"larger -c{props}"
        )
    total, per_slot = plan.get("explicit_c"), plan.get("per_slot")
    if total is None:
        return f"the server's args set no explicit -c (its context is the model's default{props})"
    bound, limit = plan.get("prompt_bound"), plan.get("max_tokens")
    slots = plan.get("slots")
    where = f"-c {total} / -np {slots}" if slots else f"-c {total} / {AUTO_SLOTS} auto slots"
    trained = plan.get("trained")
    if plan.get("can_reach") and isinstance(trained, int) and per_slot is not None:
        return (
            f"the model's trained context ({trained} tokens) is no larger than the "
            f"{per_slot}-token slot ({where}): there is nothing to lift{props}"
        )
    if isinstance(bound, int) and isinstance(limit, int) and per_slot is not None:
        return (
            f"the request provably fits its slot: at most {bound} prompt tokens + max_tokens "
            f"{limit} = {bound + limit} < the {per_slot}-token slot context ({where}){props}"
        )
    return f"the server sets -c {total} ({where}), but the arm was not planned{props}"


def trained_context(model: object) -> int | None:
    """The model's trained context (`<arch>.context_length` of its GGUF), None when the
    file cannot be read."""
    if model is None:
        return None
    try:
        kv = read_kv(str(model))
    except GGUFKVError:
        return None
    arch = kv.text("general.architecture")
    value = kv.integer(f"{arch}.context_length") if arch else None
    return value if value is not None and value > 0 else None


@dataclass(frozen=True)
class Lift:
    """The per-slot context the reply can need and what bounds it."""

    per_slot: int  # the lifted per-slot context
    current: int  # the incident's per-slot context
    slots: int
    prompt_bound: int
    allowance: int  # max_tokens, or ANSWER_ALLOWANCE without it
    from_max_tokens: bool
    trained: int | None

    @property
    def total(self) -> int:
        return self.per_slot * self.slots

    def variant(self, was: int) -> str:
        need = "max_tokens" if self.from_max_tokens else "an answer allowance of"
        bound = (
            f", bounded by the trained context {self.trained}"
            if self.trained is not None and self.per_slot == self.trained
            else ""
        )
        return (
            f"server with -c {self.total} (was {was}), same slots: {self.per_slot} tokens per "
            f"slot (was {self.current}) = prompt bound {self.prompt_bound} + {need} "
            f"{self.allowance}{bound}"
        )


def lift_for(stack: Stack, request: JsonObject) -> Lift | None:
    """The lifted context for this stack and request (None: nothing to lift)."""
    args = list(stack.server.args)
    current = per_slot_context(args)
    if current is None:
        return None
    slots = _int(flag_value(args, PARALLEL_FLAGS))
    slots = slots if slots is not None and slots > 0 else AUTO_SLOTS
    limit = max_tokens_of(request)
    allowance = limit if limit is not None else ANSWER_ALLOWANCE
    bound = prompt_token_bound(request)
    need = bound + allowance + CONTEXT_END_SLACK
    trained = trained_context(stack.server.model)
    per_slot = min(need, trained) if trained is not None else need
    if per_slot <= current:
        return None
    return Lift(per_slot, current, slots, bound, allowance, limit is not None, trained)


def with_context(args: tuple[str, ...] | list[str], total: int) -> list[str]:
    """`args` with every context flag removed and `-c total` added."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in CTX_FLAGS:
            skip = True
            continue
        if arg.startswith("--ctx-size="):
            continue
        out.append(arg)
    return [*out, "-c", str(total)]


def _slot_context(props: object) -> int | None:
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def fill_facts(props: object, status: int | None, body: object) -> ContextFill:
    """What one reply says about the context: per-slot n_ctx, tokens used, whether the
    reply reached the context end or the prompt was refused as too long. Pure."""
    n_ctx = _slot_context(props)
    facts: ContextFill = {"name": FACTS, "n_ctx_slot": n_ctx, "status": status}
    reply: JsonObject = body if isinstance(body, dict) else {}
    error = reply.get("error")
    if isinstance(error, dict):
        message = str(error.get("message") or "")[:300]
        exceeded = error.get("type") == EXCEED_TYPE or EXCEED_TEXT in message
        prompt = error.get("n_prompt_tokens")
        facts["error"] = message
        facts["exceeded"] = exceeded
        facts["prompt_tokens"] = prompt if isinstance(prompt, int) else None
        facts["n_ctx_slot"] = error.get("n_ctx") if isinstance(error.get("n_ctx"), int) else n_ctx
        facts["reached_context"] = exceeded
        return facts
    raw_usage = reply.get("usage")
    usage: JsonObject = raw_usage if isinstance(raw_usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    choices = reply.get("choices")
    finish = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        finish = choices[0].get("finish_reason")
    raw_verbose = reply.get("__verbose")
    verbose: JsonObject = raw_verbose if isinstance(raw_verbose, dict) else {}
    used = prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
    reached = None
    if used is not None and n_ctx is not None:
        reached = used + CONTEXT_END_SLACK >= n_ctx
    facts["exceeded"] = False
    facts["prompt_tokens"] = prompt
    facts["completion_tokens"] = completion
    facts["tokens_used"] = used
    facts["finish_reason"] = finish
    facts["truncated"] = verbose.get("truncated")
    facts["reached_context"] = reached
    return facts


def always_fits(facts: ContextFill) -> bool:
    """The request's prompt plus its max_tokens fit the slot: no reply can reach the end."""
    prompt, limit, n_ctx = (
        facts.get("prompt_tokens"),
        facts.get("max_tokens"),
        facts.get("n_ctx_slot"),
    )
    if isinstance(prompt, int) and isinstance(limit, int) and isinstance(n_ctx, int):
        return prompt + limit + CONTEXT_END_SLACK < n_ctx
    return False


async def context_fill(ctx: ObserveContext) -> ContextFill:
    """One replay of the request on the incident's server and on the larger-context one."""
    facts: ContextFill = {"name": FACTS, "max_tokens": max_tokens_of(ctx.request)}
    for label, server in (("incident", ctx.base), ("arm", ctx.server)):
        client = llama_client.LlamaClient(
            server.base_url, timeout=ctx.timeout, api_key=server.api_key
        )
        try:
            props = await client.props()
            result = await client.chat(replay_body(ctx.request, ctx.seed))
            seen = fill_facts(props, result.status_code, result.json)
        except LlamaClientError as exc:
            seen = ContextFill(name=FACTS, error=str(exc)[:300], reached_context=None)
        finally:
            await client.aclose()
        if label == "incident":
            facts.update(seen)
            facts["always_fits"] = always_fits(facts)
        else:
            arm = seen.copy()
            arm.pop("name", None)
            facts["arm"] = arm
    facts["summary"] = fill_summary(facts)
    return facts


def _one_fill(facts: ContextFill) -> str:
    if facts.get("exceeded"):
        return f"prompt of {facts.get('prompt_tokens')} tokens refused"
    if facts.get("tokens_used") is None:
        return f"no token counts ({facts.get('error') or 'no usage in the reply'})"
    return f"{facts['tokens_used']} tokens used, finish {facts.get('finish_reason')}"


def fill_summary(facts: ContextFill) -> str:
    """One line for the diagnosis: per-slot context vs what the request used."""
    arm = facts.get("arm") or {}
    return (
        f"context fill: slot n_ctx {facts.get('n_ctx_slot')}, {_one_fill(facts)}; with -c "
        f"lifted: slot n_ctx {arm.get('n_ctx_slot')}, {_one_fill(arm)}"
    )


@dataclass(frozen=True)
class ContextLifted:
    id: str = ARM
    precondition: str = (
        "-c set in the server args, a request whose prompt + max_tokens can reach the slot, "
        "and a trained context larger than the slot"
    )
    level: str = "server"
    order: int = 55

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        total = context_of(server.args)
        if not relaunchable(stack) or total is None:
            return None
        if not could_reach_context(server.args, request):
            return None
        lift = lift_for(stack, request)
        if lift is None:
            return None
        return PlannedArm(
            self.id,
            lift.variant(total),
            self.level,
            ("context-size",),
            config=server.with_args(with_context(server.args, lift.total)),
            observe=context_fill,
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ContextLifted())
