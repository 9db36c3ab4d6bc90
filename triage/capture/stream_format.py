"""Strict per-delta validation of a streamed chat completion against the OpenAI chunk format.

A streamed reply is re-assembled leniently (triage/capture/stream.py: a late id, a resent
name, a missing index are all absorbed), which hides exactly what breaks stricter clients.
This validator watches the same chunks as they are applied and records, per bad delta, what
the OpenAI format (ChatCompletionChunk) does not allow:

- a choice without an integer `index`;
- a `tool_calls` delta without an integer `index`;
- the first delta of a tool call without `id` or `function.name`, or with a `type` other than
  "function" (the format marks `type` optional, and strict clients such as the AI SDK accept
  it missing: a server that omits it breaks nobody);
- a new tool call whose `index` jumps (calls are numbered 0, 1, 2, ... in order);
- the same call (same `id`) at a different `index`, or a second `id` at an index in use;
- `function.name` sent again in a later delta of the call (clients concatenate it:
  "get_weatherget_weather");
- `function.arguments` that is not a string, or whose concatenation is not JSON once the
  stream finished;
- a stream ended by `[DONE]` with a choice that never got a `finish_reason`.

Content and tool_calls in the same delta are allowed by the format (both are optional
fields of one delta) and are not a violation. A stream cut short (no [DONE], no
finish_reason) is the truncated-stream finding's case: its unfinished arguments are not
reported here. Bounded: at most MAX_VIOLATIONS are kept (the count of the rest is kept).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kb.jsontypes import JsonObject

__all__ = ["MAX_VIOLATIONS", "STREAM_FORMAT_KEY", "StreamFormat", "Violation"]

# Violations kept per stream; a server that breaks every delta would otherwise store one
# record per token.
MAX_VIOLATIONS = 50
# Where the re-assembled response keeps them (like llama-server's `__verbose`): a private
# key, present only when a stream broke the format.
STREAM_FORMAT_KEY = "__stream_format"
# Concatenated arguments longer than this are not parsed (bounded work).
MAX_ARGUMENT_CHARS = 1_000_000


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Violation:
    """One delta that breaks the format: its event number in the stream (1-based chunk
    count), the transcript line when known, a short code and what is wrong."""

    event: int
    line: int | None
    code: str
    problem: str

    def to_dict(self) -> JsonObject:
        return {"event": self.event, "line": self.line, "code": self.code, "problem": self.problem}


@dataclass
class _Call:
    id: str | None
    index: int
    arguments: list[str] = field(default_factory=list)
    arguments_chars: int = 0
    first_event: int = 0
    first_line: int | None = None
    reported: bool = False  # its arguments already reported (not a string)


@dataclass
class _ChoiceFormat:
    calls: dict[int, _Call] = field(default_factory=dict)
    finished: bool = False


@dataclass
class StreamFormat:
    """The format state of one stream: fed every chunk, asked for violations at the end."""

    choices: dict[int, _ChoiceFormat] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    dropped: int = 0
    _ended: list[Violation] | None = None

    def _add(self, event: int, line: int | None, code: str, problem: str) -> None:
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(Violation(event, line, code, problem))
        else:
            self.dropped += 1

    def feed(self, chunk: JsonObject, event: int, line: int | None = None) -> None:
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = _int_or_none(choice.get("index"))
            if index is None:
                self._add(
                    event, line, "choice-index", f"choices[{position}] has no integer `index`"
                )
                index = position
            state = self.choices.setdefault(index, _ChoiceFormat())
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                state.finished = True
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("tool_calls"), list):
                for pos, call in enumerate(delta["tool_calls"]):
                    self._tool_call(state, index, pos, call, event, line)

    def _tool_call(
        self, state: _ChoiceFormat, choice: int, pos: int, delta: Any, event: int, line: int | None
    ) -> None:
        at = f"choice {choice} tool_calls[{pos}]"
        if not isinstance(delta, dict):
            self._add(event, line, "tool-call-shape", f"{at} is not an object")
            return
        index = _int_or_none(delta.get("index"))
        call_id = delta.get("id") if isinstance(delta.get("id"), str) and delta["id"] else None
        raw_function = delta.get("function")
        function: dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        name = function.get("name")
        if index is None:
            self._add(event, line, "tool-index", f"{at} has no integer `index`")
            index = pos
        moved = next(
            (c for c in state.calls.values() if call_id and c.id == call_id and c.index != index),
            None,
        )
        if moved is not None:
            self._add(
                event,
                line,
                "tool-index-changed",
                f"{at}: call {call_id} moved from index {moved.index} to {index}",
            )
        current = state.calls.get(index)
        if current is None:
            current = self._new_call(state, at, index, call_id, delta, name, moved, event, line)
        else:
            self._next_delta(current, at, index, call_id, name, event, line)
        arguments = function.get("arguments")
        if arguments is None:
            return
        if not isinstance(arguments, str):
            self._add(
                event,
                line,
                "tool-arguments-type",
                f"{at}: function.arguments is {type(arguments).__name__}, not a string",
            )
            current.reported = True
            return
        if current.arguments_chars <= MAX_ARGUMENT_CHARS:
            current.arguments.append(arguments)
            current.arguments_chars += len(arguments)

    def _new_call(
        self,
        state: _ChoiceFormat,
        at: str,
        index: int,
        call_id: str | None,
        delta: JsonObject,
        name: Any,
        moved: _Call | None,
        event: int,
        line: int | None,
    ) -> _Call:
        """The first delta of a call: its index comes next and it names id and name (and a
        type, if any, of "function")."""
        expected = len(state.calls)
        if index != expected and moved is None:
            self._add(
                event,
                line,
                "tool-index-jump",
                f"{at}: a new tool call at index {index}, expected {expected}",
            )
        missing = [
            label
            for label, ok in (
                ("id", call_id is not None),
                ("type function", delta.get("type") in (None, "function")),
                ("function.name", isinstance(name, str) and bool(name)),
            )
            if not ok
        ]
        if missing:
            self._add(
                event,
                line,
                "tool-first-delta",
                f"{at}: the first delta of the call at index {index} lacks " + ", ".join(missing),
            )
        call = state.calls[index] = _Call(call_id, index, first_event=event, first_line=line)
        return call

    def _next_delta(
        self,
        current: _Call,
        at: str,
        index: int,
        call_id: str | None,
        name: Any,
        event: int,
        line: int | None,
    ) -> None:
        """A later delta of a call: same id, and no name sent again (clients concatenate it)."""
        if call_id is not None and current.id is not None and call_id != current.id:
            self._add(
                event,
                line,
                "tool-index-reused",
                f"{at}: index {index} holds call {current.id}, this delta sends {call_id}",
            )
        if isinstance(name, str) and name:
            self._add(
                event,
                line,
                "tool-name-repeated",
                f"{at}: function.name {name[:80]!r} sent again (first sent at event "
                f"{current.first_event}); clients concatenate it",
            )
        if current.id is None and call_id is not None:
            current.id = call_id

    def finish(self, *, done: bool, last_event: int) -> list[Violation]:
        """The violations of a stream that ended (`done`: it reached `[DONE]`); idempotent."""
        if self._ended is not None:
            return list(self._ended)
        for index in sorted(self.choices):
            state = self.choices[index]
            if done and not state.finished:
                self._add(
                    last_event,
                    None,
                    "finish-reason-missing",
                    f"choice {index}: the stream ended with [DONE] and no finish_reason",
                )
            if not (done or state.finished):
                continue  # cut short: truncated-stream's case, arguments unfinished
            for call in state.calls.values():
                if call.reported or call.arguments_chars > MAX_ARGUMENT_CHARS:
                    continue
                text = "".join(call.arguments)
                try:
                    json.loads(text)
                except (ValueError, RecursionError) as exc:
                    self._add(
                        call.first_event,
                        call.first_line,
                        "tool-arguments-json",
                        f"choice {index} tool call at index {call.index}: the arguments "
                        f"deltas concatenate to invalid JSON ({str(exc)[:80]}): "
                        f"{text[:80]!r}",
                    )
        self._ended = list(self.violations)
        return list(self._ended)

    def record(self, *, done: bool, last_event: int) -> dict[str, Any] | None:
        """The JSON kept with the response, or None when the stream is well formed."""
        violations = self.finish(done=done, last_event=last_event)
        if not violations:
            return None
        return {
            "violations": [v.to_dict() for v in violations],
            "dropped": self.dropped,
        }
