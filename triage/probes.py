"""Probe arms: the protocol an arm implements, and the pure request transforms.

Each arm changes one thing about the failing request or server. Every arm, built-in or
from a plugin, is a catalogue entry (`catalogue.arms.add(...)`) implementing `ProbeArm`;
the built-ins live in `triage/engine/arms/`. Pure: request bodies and server
configurations in, request bodies and configurations out. The engine runs them
(triage/engine/); the cause rules (triage/causes.py) read their outcomes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# The module, not its function: `catalogue()` is read at call time (tests swap it).
import triage.catalogue
from kb.jsontypes import JsonObject
from triage.llama.endpoints import Endpoint, endpoint_of
from triage.plugin_api import ArmEntry, CauseEntry
from triage.stackfile import ServerConfig, Stack, split_spec_flags

NO_THINK_SUFFIX = " /no_think"
# Markers a chat template puts in the prompt when thinking is on: Gemma 4's system-turn
# flag, and an opened-but-not-closed think block (Qwen3 / DeepSeek style templates).
THINKING_MARKERS = ("<|think|>",)
OPEN_THINK_TAG = "<think>"
CLOSE_THINK_TAG = "</think>"


# An observation hook's facts: a JSON-serialisable mapping with its "name" (the built-ins
# declare theirs as TypedDicts), stored as evidence and read by the rules.
ObserveHook = Callable[["ObserveContext"], Coroutine[Any, Any, "Mapping[str, object] | None"]]
# A precondition checked once the incident's server has been observed (template render,
# props): (the observations so far, the captured exchange or None) -> None when the arm can
# matter, else why it cannot (the arm is then skipped, and the plan says why).
Requires = Callable[[Mapping[str, Any], "Mapping[str, Any] | None"], "str | None"]


@dataclass
class ObserveContext:
    """What an arm's observation hook gets: the incident's server, the arm's own server
    (server-level arms; the incident's for request-level ones), the failing request."""

    base: Any  # triage.engine.servers.Server
    server: Any
    request: JsonObject
    seed: int
    timeout: float
    divergence_seeds: int = 4
    # The captured exchange (its stored dict form) when the run has one: observation
    # hooks may compare it with what the server answers (client-handling does).
    exchange: JsonObject | None = None
    # Where the client's requests went: the stack's `[gateway]` when it has one (a
    # triage.engine.servers.Server), else None (the incident's server itself).
    client_side: Any = None


@dataclass(frozen=True)
class PlannedArm:
    """One arm as planned for this request and stack.

    Request-level arms replay `transform(request)` on the incident's server; server-level
    arms launch `config` and replay the unchanged request. `decides` names the causes whose
    verdict can depend on this arm (the scheduler stops an arm once no outcome of it could
    change those verdicts; an arm that decides nothing is informational and runs until its
    own decision). `observe`, when set, runs once with both servers up and returns facts
    (a dict with a `name`) stored as observation evidence and passed to the cause rules."""

    name: str
    variant: str
    level: str  # request | server
    decides: tuple[str, ...] = ()
    transform: Callable[[JsonObject], JsonObject] = copy.deepcopy
    config: ServerConfig | None = None
    observe: ObserveHook | None = None
    # "always", or "crash": only when the incident's server crashes at startup (each
    # replay of such a run is a launch, and the failure is the crash), or "observe": an
    # observation-only arm -- no replays; its `observe` hook runs once on the incident's
    # server (request-level) and its facts reach the cause rules.
    when: str = "always"
    # Checked after the incident's server is observed (see `Requires`); None: always runs.
    requires: Requires | None = None
    # Where a request-level arm's replays go when the stack has a `[gateway]`: "client"
    # (what the client used: the gateway, else the server) or "server" (the server itself,
    # bypassing the gateway). `stream`: replay streamed (SSE) instead of non-streamed.
    endpoint: str = "client"
    stream: bool = False
    # A server-level arm whose launch depends on what the incident's server measured (the
    # tokens of the longest embeddings input): called with the observations before the arm
    # launches; returns the arm as it launches (its config and variant), or why the arm
    # cannot matter (it is then skipped).
    configure: Callable[[Mapping[str, Any]], PlannedArm | str] | None = None


@runtime_checkable
class ProbeArm(Protocol):
    """What a probe-arm plugin implements (register it with `catalogue.arms.add(obj)`).

    - `id`: the arm name in the diagnosis and evidence; `level`: "request" or "server";
    - `order`: where it runs in the plan (request arms before server arms; built-ins use
      10-90, plugins anything else);
    - `plan(stack, request) -> PlannedArm | None`: None when the arm does not apply to this
      stack/request (e.g. no speculative flags to strip); otherwise how it varies the
      request (`transform`) or the server (`config`), the causes it `decides`, an
      optional `observe` hook, and `when` it runs ("always", or "crash": only when the
      incident's server crashes at startup);
    - optional `endpoints`: a request-level arm is planned for an /v1/embeddings or
      /v1/rerank request only when it lists "embeddings" / "rerank" here (the others vary
      what only a chat completion has); server-level arms are planned for any request.
    """

    id: str
    level: str
    order: int

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None: ...


@dataclass(frozen=True)
class RequestArm:
    """A built-in request-level arm: replayed on the incident's own server."""

    id: str
    variant: str
    transform: Callable[[JsonObject], JsonObject]
    decides: tuple[str, ...]
    order: int
    applies: Callable[[JsonObject], bool] = lambda request: True
    level: str = "request"
    # What the arm needs to matter (printed when it is skipped), and the check made once the
    # server is observed.
    precondition: str = ""
    requires: Requires | None = None

    @property
    def name(self) -> str:
        return self.id

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not self.applies(request):
            return None
        return PlannedArm(
            self.id, self.variant, "request", self.decides, self.transform, requires=self.requires
        )


NOT_APPLICABLE = "does not apply to this stack and request"


def serves_endpoint(arm: ArmEntry, request: Mapping[str, Any]) -> bool:
    """Can a request-level arm vary this request? An /v1/embeddings or /v1/rerank request
    only by the arms that say so (`endpoints`): the others vary what only a chat completion
    has (thinking, max_tokens, tools, history)."""
    endpoint = endpoint_of(request)
    if endpoint is Endpoint.CHAT or arm.level != "request":
        return True
    return endpoint.name.lower() in tuple(getattr(arm, "endpoints", ()) or ())


def _chat_only(request: Mapping[str, Any]) -> str:
    return f"varies a chat completion; the request is for {endpoint_of(request).path}"


def skipped_arms(
    stack: Stack, request: JsonObject, arms: Iterable[ArmEntry] | None = None
) -> list[tuple[str, str]]:
    """(arm, why) for every catalogue arm that this stack and request do not plan: the
    arm's declared `precondition` (what it needs to matter), else a generic reason."""
    if arms is None:
        arms = list(triage.catalogue.catalogue().arms)
    out = []
    # Arms of one family (the request-field ablation arms) not planned share one line.
    families: dict[str, list[str]] = {}
    for arm in sorted(arms, key=lambda a: (a.level != "request", int(getattr(a, "order", 100)))):
        if not serves_endpoint(arm, request):
            out.append((str(arm.id), _chat_only(request)))
        elif arm.plan(stack, request) is None:
            family = getattr(arm, "family", None)
            if isinstance(family, str) and family:
                if family not in families:
                    families[family] = []
                    out.append((family, ""))
                families[family].append(str(arm.id))
                continue
            why = str(getattr(arm, "precondition", "") or NOT_APPLICABLE)
            out.append((str(arm.id), why))
    return [
        (arm, why or f"the request sets none of their fields: {', '.join(families[arm])}")
        for arm, why in out
    ]


def reasoning_in(exchange: Mapping[str, Any] | None) -> bool:
    """Does the captured reply hold reasoning text (the model thought, whatever the
    template says)?"""
    response = (exchange or {}).get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and str(message.get("reasoning_content") or "").strip():
            return True
    return False


THINKING_PRECONDITION = "thinking on for the request (template render) or reasoning in the reply"


def requires_thinking(facts: Mapping[str, Any], exchange: Mapping[str, Any] | None) -> str | None:
    """An arm that switches or bounds thinking can matter only when the request thinks: the
    template render shows thinking on, or enable_thinking=false renders another prompt, or
    the captured reply holds reasoning. None (run it) when the render is unknown."""
    render = facts.get("template-render") or {}
    if render.get("error") or "thinking_on" not in render:
        return None
    if render.get("thinking_on") or render.get("enable_thinking_false_changes_prompt"):
        return None
    if reasoning_in(exchange):
        return None
    return (
        "thinking is off for this request: the template render shows no thinking "
        "marker, enable_thinking=false renders the same prompt, and the captured reply "
        "has no reasoning"
    )


def max_tokens_of(request: JsonObject) -> int | None:
    for field in ("max_tokens", "max_completion_tokens", "n_predict"):
        value = request.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _set_max_tokens(request: JsonObject, value: int) -> None:
    fields = [f for f in ("max_tokens", "max_completion_tokens", "n_predict") if f in request]
    for field in fields or ["max_tokens"]:
        request[field] = value


def thinking_off(request: JsonObject) -> JsonObject:
    body = copy.deepcopy(request)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    kwargs["enable_thinking"] = False
    body["chat_template_kwargs"] = kwargs
    return body


def no_think_suffix(request: JsonObject) -> JsonObject:
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


def token_limit_x4(request: JsonObject) -> JsonObject:
    body = copy.deepcopy(request)
    limit = max_tokens_of(body)
    if limit is not None:
        _set_max_tokens(body, limit * 4)
    return body


def reasoning_budget(request: JsonObject) -> JsonObject:
    """Cap the thought at a quarter of the original max_tokens, keeping max_tokens itself."""
    body = copy.deepcopy(request)
    limit = max_tokens_of(body)
    body["reasoning_budget_tokens"] = max(16, (limit or 1024) // 4)
    return body


BASELINE_ARM = PlannedArm("baseline", "the failing request as sent, seeds varied", "request")


def plan_arms(
    stack: Stack,
    request: JsonObject,
    arms: Iterable[ArmEntry] | None = None,
    causes: Iterable[CauseEntry] | None = None,
) -> list[PlannedArm]:
    """Every catalogue arm that applies to this stack and request, in plan order, after the
    baseline; request-level arms first. An arm also decides every cause that declares
    itself `removed_by` it (triage.causes.CauseRule), whether or not the arm names it."""
    if arms is None:
        arms = list(triage.catalogue.catalogue().arms)
    removed_by: dict[str, list[str]] = {}
    for cause in triage.catalogue.catalogue().causes if causes is None else causes:
        for arm_id in getattr(cause, "removed_by", ()):
            removed_by.setdefault(arm_id, []).append(cause.id)
    chosen = sorted(arms, key=lambda a: (a.level != "request", int(getattr(a, "order", 100))))
    planned = [BASELINE_ARM]
    for arm in chosen:
        if not serves_endpoint(arm, request):
            continue
        item = arm.plan(stack, request)
        if item is not None:
            if item.level == "server" and item.config is None:
                raise ValueError(f"server-level arm {item.name!r} planned without a config")
            extra = tuple(c for c in removed_by.get(item.name, ()) if c not in item.decides)
            planned.append(replace(item, decides=item.decides + extra) if extra else item)
    return planned


def request_arms(request: JsonObject) -> list[PlannedArm]:
    """The request-level arms that apply to this request (baseline first)."""
    stack = Stack(ServerConfig())
    return [a for a in plan_arms(stack, request) if a.level == "request" and a.when != "observe"]


def server_arms(
    stack: Stack, request: JsonObject | None = None, *, crashed: bool = False
) -> list[PlannedArm]:
    """The server-level arms this stack runs (each one launch); crash-only arms only when
    the incident's server crashes at startup."""
    return [
        a
        for a in plan_arms(stack, request or {})
        if a.level == "server" and (a.when == "always" or crashed)
    ]


def relaunchable(stack: Stack) -> bool:
    """Can server-level arms launch variants of this stack (not a bare running URL)?"""
    return not (stack.server.url and not stack.server.model)


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


def replay_body(request: JsonObject, seed: int) -> JsonObject:
    """One replicate: the request's own sampling settings, a varied seed, no prompt cache,
    non-streaming, with the raw unparsed text (`verbose`) kept for output-parsing evidence."""
    body = copy.deepcopy(request)
    body["seed"] = seed
    body["cache_prompt"] = False
    body["stream"] = False
    body.pop("stream_options", None)
    body["verbose"] = True
    return body


def template_body(request: JsonObject) -> JsonObject:
    """What /apply-template needs to render the request's prompt."""
    keys = ("messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_format")
    return {k: copy.deepcopy(request[k]) for k in keys if k in request}
