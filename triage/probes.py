"""The probe catalogue: each arm changes one thing about the failing request or server.

Pure: request bodies and server configurations in, request bodies and configurations out.
The engine runs them (triage/engine.py); causes.py reads their outcomes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triage.stackfile import (
    ServerConfig,
    Stack,
    has_spec_flags,
    set_flag,
    split_spec_flags,
    strip_spec_flags,
)

NO_THINK_SUFFIX = " /no_think"
# Markers a chat template puts in the prompt when thinking is on: Gemma 4's system-turn
# flag, and an opened-but-not-closed think block (Qwen3 / DeepSeek style templates).
THINKING_MARKERS = ("<|think|>",)
OPEN_THINK_TAG = "<think>"
CLOSE_THINK_TAG = "</think>"


@dataclass(frozen=True)
class RequestArm:
    """A request-level arm: replayed on the incident's own server."""

    name: str
    variant: str
    transform: Callable[[dict[str, Any]], dict[str, Any]]
    decides: tuple[str, ...]


@dataclass(frozen=True)
class ServerArm:
    """A server-level arm: its own launch, replaying the unchanged request."""

    name: str
    variant: str
    config: ServerConfig
    decides: tuple[str, ...]


def max_tokens_of(request: dict[str, Any]) -> int | None:
    for field in ("max_tokens", "max_completion_tokens", "n_predict"):
        value = request.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _set_max_tokens(request: dict[str, Any], value: int) -> None:
    fields = [f for f in ("max_tokens", "max_completion_tokens", "n_predict") if f in request]
    for field in fields or ["max_tokens"]:
        request[field] = value


def thinking_off(request: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(request)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    kwargs["enable_thinking"] = False
    body["chat_template_kwargs"] = kwargs
    return body


def no_think_suffix(request: dict[str, Any]) -> dict[str, Any]:
    """Append `/no_think` to the last user message, as the seed did (plain text to Gemma)."""
    body = copy.deepcopy(request)
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                message["content"] = content + NO_THINK_SUFFIX
            elif isinstance(content, list):
                content.append({"type": "text", "text": NO_THINK_SUFFIX.strip()})
            break
    return body


def token_limit_x4(request: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(request)
    limit = max_tokens_of(body)
    if limit is not None:
        _set_max_tokens(body, limit * 4)
    return body


def reasoning_budget(request: dict[str, Any]) -> dict[str, Any]:
    """Cap the thought at a quarter of the original max_tokens, keeping max_tokens itself."""
    body = copy.deepcopy(request)
    limit = max_tokens_of(body)
    body["reasoning_budget_tokens"] = max(16, (limit or 1024) // 4)
    return body


def request_arms(request: dict[str, Any]) -> list[RequestArm]:
    """The request-level arms that apply to this request (baseline first)."""
    arms = [
        RequestArm("baseline", "the failing request as sent, seeds varied", copy.deepcopy, ()),
        RequestArm(
            "thinking-off",
            "chat_template_kwargs.enable_thinking=false",
            thinking_off,
            ("reasoning-exhausts-budget", "token-limit", "output-parsing"),
        ),
        RequestArm(
            "no-think-suffix",
            "'/no_think' appended to the last user message",
            no_think_suffix,
            (),
        ),
        RequestArm(
            "reasoning-budget",
            "reasoning_budget_tokens = max_tokens/4, max_tokens unchanged",
            reasoning_budget,
            ("reasoning-exhausts-budget",),
        ),
    ]
    if max_tokens_of(request) is not None:
        arms.append(
            RequestArm("token-limit-x4", "max_tokens x4", token_limit_x4, ("token-limit",))
        )
    return arms


def server_arms(stack: Stack) -> list[ServerArm]:
    """The server-level arms this stack can run (each one launch)."""
    server = stack.server
    arms: list[ServerArm] = []
    if server.url and not server.model:
        return arms  # a running server we cannot relaunch: request-level probes only
    if has_spec_flags(server.args):
        arms.append(
            ServerArm(
                "spec-off",
                "speculative-decoding flags stripped from the server args",
                server.with_args(strip_spec_flags(server.args)),
                ("speculative-decoding",),
            )
        )
    if stack.alternate_model is not None:
        arms.append(
            ServerArm(
                "alt-weights",
                f"alternate weights {Path(stack.alternate_model).name}",
                ServerConfig(server.binary, stack.alternate_model, server.args),
                ("quantized-weights",),
            )
        )
    if stack.alternate_binary is not None:
        arms.append(
            ServerArm(
                "alt-build",
                f"alternate binary {stack.alternate_binary}",
                ServerConfig(stack.alternate_binary, server.model, server.args),
                ("server-build",),
            )
        )
    arms.append(
        ServerArm(
            "server-reasoning-off",
            "server started with --reasoning off (the first fix candidate)",
            server.with_args(set_flag(server.args, "--reasoning", "off", "-rea")),
            ("reasoning-exhausts-budget",),
        )
    )
    return arms


def known_good_dimensions(stack: Stack) -> dict[str, tuple[Any, Any]]:
    """Which dimensions differ between the failing and the known-good configuration."""
    if stack.known_good is None:
        return {}
    bad, good = stack.server, stack.known_good
    dims: dict[str, tuple[Any, Any]] = {}
    if good.model and bad.model and Path(good.model) != Path(bad.model):
        dims["weights"] = (bad.model, good.model)
    bad_other, bad_spec = split_spec_flags(bad.args)
    good_other, good_spec = split_spec_flags(good.args)
    if bad_spec != good_spec:
        dims["spec-flags"] = (tuple(bad_spec), tuple(good_spec))
    if good.binary and str(good.binary) != str(bad.binary or ""):
        dims["binary"] = (bad.binary, good.binary)
    if bad_other != good_other:
        dims["other-args"] = (tuple(bad_other), tuple(good_other))
    return dims


def revert_dimensions(stack: Stack, names: set[str]) -> ServerConfig:
    """The failing configuration with the named dimensions set to their known-good values."""
    assert stack.known_good is not None
    bad, good = stack.server, stack.known_good
    model = good.model if "weights" in names else bad.model
    binary = good.binary if "binary" in names else bad.binary
    other = split_spec_flags(good.args if "other-args" in names else bad.args)[0]
    spec = split_spec_flags(good.args if "spec-flags" in names else bad.args)[1]
    return ServerConfig(binary, model, tuple(other + spec))


def thinking_on_in_prompt(prompt: str) -> bool:
    """Does a rendered prompt switch thinking on (Gemma 4 flag, or an open think block)?"""
    if any(marker in prompt for marker in THINKING_MARKERS):
        return True
    tail = prompt[-200:]
    return OPEN_THINK_TAG in tail and CLOSE_THINK_TAG not in tail.split(OPEN_THINK_TAG)[-1]


def replay_body(request: dict[str, Any], seed: int) -> dict[str, Any]:
    """One replicate: the request's own sampling settings, a varied seed, no prompt cache,
    non-streaming, with the raw unparsed text (`verbose`) kept for output-parsing evidence."""
    body = copy.deepcopy(request)
    body["seed"] = seed
    body["cache_prompt"] = False
    body["stream"] = False
    body.pop("stream_options", None)
    body["verbose"] = True
    return body


def template_body(request: dict[str, Any]) -> dict[str, Any]:
    """What /apply-template needs to render the request's prompt."""
    keys = ("messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_format")
    return {k: copy.deepcopy(request[k]) for k in keys if k in request}
