"""The `history-normalised` arm: replay the last turn of a multi-turn request with its
history in the shape every chat template and llama-server's history parser accept.

Normalisations, each one a shape seen in public reports (only the messages before the last
one are touched; the last turn is replayed as sent):

* tool-call `arguments` that are not a JSON string -- an object, or a Python-literal string
  such as `{'location': 'Paris'}` (a client that used `str()` instead of `json.dumps`) --
  become JSON text (llama-server answers HTTP 500 "Failed to parse tool call arguments as
  JSON" otherwise);
* tool-call ids: missing or non-string ids get `call_<n>`, and a tool message without
  `tool_call_id` is linked to the call it answers;
* tool results and assistant content given as objects / part lists become text;
* reasoning passed back inline (`<think>...</think>`, Gemma 4's
  `<|channel>thought ...<channel|>`) or under another name (`reasoning`, `thinking`)
  moves to `reasoning_content`, where llama-server hands it to the template.

Planned only for a request with an assistant turn before the last message whose history
these rules change; the `conversation-history` observation (no request) records the shape.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from typing import Any, TypedDict

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import ObserveContext, PlannedArm
from triage.stackfile import Stack

__all__ = ["ARM", "OBSERVATION", "normalise_history", "register"]

ARM = "history-normalised"
OBSERVATION = "conversation-history"
MAX_LITERAL_CHARS = 100_000  # a Python-literal argument string longer than this is left alone
INLINE_REASONING = (
    re.compile(r"^\s*<think>(?P<thought>.*?)</think>\s*", re.DOTALL),
    re.compile(r"^\s*<\|channel\>thought\n?(?P<thought>.*?)<channel\|>\s*", re.DOTALL),
)


def _json_text(value: Any) -> str | None:
    """`arguments` as JSON text, or None when it already is (or cannot be made) one."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        return None
    try:
        json.loads(value)
        return None
    except ValueError:
        pass
    if len(value) > MAX_LITERAL_CHARS:
        return None
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(literal, (dict, list)):
        try:
            return json.dumps(literal, ensure_ascii=False)
        except (TypeError, ValueError):
            return None
    return None


def _text_of(value: Any) -> str | None:
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return None


def _calls(message: JsonObject, changes: set[str], counter: list[int]) -> list[str]:
    ids = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        if not isinstance(call.get("id"), str) or not call["id"]:
            call["id"] = f"call_{counter[0]}"
            changes.add("tool-call ids")
        counter[0] += 1
        ids.append(call["id"])
        function = call.get("function")
        if isinstance(function, dict) and "arguments" in function:
            fixed = _json_text(function["arguments"])
            if fixed is not None:
                function["arguments"] = fixed
                changes.add("tool-call arguments as JSON text")
    return ids


def _reasoning(message: JsonObject, changes: set[str]) -> None:
    for key in ("reasoning", "thinking"):
        if isinstance(message.get(key), str) and not message.get("reasoning_content"):
            message["reasoning_content"] = message.pop(key)
            changes.add("reasoning passed back as reasoning_content")
    content = message.get("content")
    if not isinstance(content, str):
        return
    for pattern in INLINE_REASONING:
        match = pattern.match(content)
        if match:
            message["content"] = content[match.end() :]
            if not message.get("reasoning_content"):
                message["reasoning_content"] = match.group("thought").strip()
            changes.add("inline reasoning moved to reasoning_content")
            return


def normalise_history(request: JsonObject) -> tuple[JsonObject, list[str]]:
    """The request with every message before the last one normalised, and what changed."""
    body = copy.deepcopy(request)
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return body, []
    changes: set[str] = set()
    counter, pending = [0], []
    for message in messages[:-1]:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant":
            pending = _calls(message, changes, counter)
            _reasoning(message, changes)
            text = _text_of(message.get("content"))
            if text is not None:
                message["content"] = text
                changes.add("content as text")
        elif role == "tool":
            if not isinstance(message.get("tool_call_id"), str) and pending:
                message["tool_call_id"] = pending[0]
                changes.add("tool-call ids")
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
            text = _text_of(message.get("content"))
            if text is not None:
                message["content"] = text
                changes.add("content as text")
    return body, sorted(changes)


class HistoryFacts(TypedDict):
    """The `conversation-history` observation: the shape of the request's history."""

    name: str
    messages: int
    assistant_turns: int
    changes: list[str]
    summary: str


def history_facts(request: JsonObject) -> HistoryFacts:
    """The shape of the request's history (pure: no request is sent)."""
    messages = request.get("messages")
    earlier = messages[:-1] if isinstance(messages, list) else []
    turns = sum(1 for m in earlier if isinstance(m, dict) and m.get("role") == "assistant")
    _, changes = normalise_history(request)
    summary = (
        "single-turn request (no earlier assistant turn)"
        if not turns
        else f"{turns} earlier assistant turn(s); normalising changes: "
        + (", ".join(changes) or "nothing")
    )
    return {
        "name": OBSERVATION,
        "messages": len(messages) if isinstance(messages, list) else 0,
        "assistant_turns": turns,
        "changes": changes,
        "summary": summary,
    }


async def _observe(ctx: ObserveContext) -> HistoryFacts:
    return history_facts(ctx.request)


def _normalised(request: JsonObject) -> JsonObject:
    return normalise_history(request)[0]


class HistoryNormalised:
    """Request-level arm: the last turn replayed with the history normalised."""

    id, level, order = ARM, "request", 50
    precondition = "assistant turns in the history that normalising would change"

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        facts = history_facts(request)
        if not facts["assistant_turns"] or not facts["changes"]:
            return None
        return PlannedArm(
            ARM,
            "history normalised: " + ", ".join(facts["changes"]),
            "request",
            ("conversation-shape",),
            transform=_normalised,
        )


class ConversationHistory:
    """Observation-only arm (no request): the history's shape, for the rule's rejections."""

    id, level, order = OBSERVATION, "request", 96

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        return PlannedArm(
            OBSERVATION,
            "the shape of the request's history",
            "request",
            ("conversation-shape",),
            observe=_observe,
            when="observe",
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(HistoryNormalised())
    catalogue.arms.add(ConversationHistory())
