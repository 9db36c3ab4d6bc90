"""Server-sent events: a streamed chat completion re-assembled into one response.

The transcript is read line by line into an explicit `_Reader` state (current event,
its data lines, the stream being built); `data: [DONE]` ends a stream, and data after it
starts a new one -- two concatenated streams are two replies, never one merged reply.

Linear time and bounded memory on long transcripts (hundreds of thousands of events): lines
are cut lazily (never a list of every line), each event is decoded with one shared JSON
decoder, its nesting is walked only when its brackets could exceed the depth bound, and the
content pieces of a reply are joined in blocks as they come (not one string per event kept
to the end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kb.jsontypes import JsonObject
from triage.capture.common import (
    Body,
    check_depth,
    json_type,
    normalise_error,
    reject_constant,
)
from triage.capture.model import MAX_JSON_DEPTH, CaptureError
from triage.capture.redact import redact_json
from triage.capture.stream_format import STREAM_FORMAT_KEY, StreamFormat

__all__ = ["looks_like_sse", "reassemble_sse", "reassemble_sse_streams"]

# The line boundaries of str.splitlines, found lazily.
_LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_DECODER = json.JSONDecoder(parse_constant=reject_constant)
# Content pieces kept apart before they are joined into one block.
_PIECES_PER_BLOCK = 2048


def _lines(text: str) -> Iterator[str]:
    """str.splitlines(), one line at a time."""
    start = 0
    for match in _LINE_BREAK.finditer(text):
        yield text[start : match.start()]
        start = match.end()
    if start < len(text):
        yield text[start:]


def _decode(payload: str, file: str) -> Any:
    """One event's JSON; its nesting checked only when it has enough brackets to exceed the
    bound (counting is C-fast; walking every event is not)."""
    value = _DECODER.decode(payload)
    if payload.count("{") + payload.count("[") >= MAX_JSON_DEPTH:
        check_depth(value, file)
    return value


def _append(pieces: list[str], piece: str) -> None:
    """Add a content piece, joining the last block of pieces into one string once it is
    long: each character is copied at most twice, the list stays short."""
    pieces.append(piece)
    if len(pieces) % _PIECES_PER_BLOCK == 0 and len(pieces) >= 2 * _PIECES_PER_BLOCK:
        tail = "".join(pieces[-_PIECES_PER_BLOCK:])
        del pieces[-_PIECES_PER_BLOCK:]
        pieces.append(tail)


def looks_like_sse(text: str) -> bool:
    """The first non-blank line is an SSE field (or comment)."""
    for line in _lines(text):
        stripped = line.strip()
        if not stripped:
            continue
        return (
            stripped.startswith(("data:", "event:", "error:", "id:", "retry:"))
            or stripped == ":"
            or stripped.startswith(": ")
        )
    return False


@dataclass
class _ChoiceState:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None


def _merge_tool_call(state: _ChoiceState, delta: Any, position: int) -> None:
    if not isinstance(delta, dict):
        return
    index = delta.get("index", position)
    if not isinstance(index, int) or isinstance(index, bool):
        index = position
    call = state.tool_calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str) and delta["id"] and not call["id"]:
        call["id"] = delta["id"]
    if isinstance(delta.get("type"), str):
        call["type"] = delta["type"]
    function = delta.get("function")
    if isinstance(function, dict):
        name = function.get("name")
        if isinstance(name, str) and name:
            current = call["function"]["name"]
            # OpenAI sends the name once; some servers resend it whole in later chunks.
            if not current or name.startswith(current):
                call["function"]["name"] = name
            elif name != current:
                call["function"]["name"] = current + name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["function"]["arguments"] += arguments
        elif isinstance(arguments, (dict, list)):
            call["function"]["arguments"] += json.dumps(arguments, ensure_ascii=False)


def _apply_choice(state: _ChoiceState, choice: JsonObject) -> None:
    delta: dict[str, Any] = {}
    for key in ("delta", "message"):  # a final chunk may carry a whole message
        if isinstance(choice.get(key), dict):
            delta = choice[key]
            break
    if isinstance(choice.get("text"), str):  # /v1/completions streams
        _append(state.content, choice["text"])
    if isinstance(delta.get("role"), str):
        state.role = delta["role"]
    if isinstance(delta.get("content"), str):
        _append(state.content, delta["content"])
    reasoning = delta.get("reasoning_content", delta.get("reasoning"))
    if isinstance(reasoning, str):
        _append(state.reasoning, reasoning)
    tool_calls = delta.get("tool_calls")
    if isinstance(tool_calls, list):
        for pos, call in enumerate(tool_calls):
            _merge_tool_call(state, call, pos)
    if isinstance(choice.get("finish_reason"), str):
        state.finish_reason = choice["finish_reason"]


@dataclass
class StreamState:
    """One streamed reply being re-assembled from its chunks."""

    first_line: int = 0
    choices: dict[int, _ChoiceState] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    usage: Any = None
    timings: Any = None
    verbose: Any = None
    done: bool = False
    error: dict[str, Any] | None = None
    chunks: int = 0
    cut_mid_event: bool = False
    format: StreamFormat = field(default_factory=StreamFormat)

    def apply(self, chunk: JsonObject, line: int | None = None) -> None:
        self.chunks += 1
        self.format.feed(chunk, self.chunks, line)
        if len(self.meta) < 4:
            for key in ("id", "model", "created", "system_fingerprint"):
                if key in chunk and key not in self.meta:
                    self.meta[key] = chunk[key]
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        if chunk.get("timings") is not None:
            self.timings = chunk["timings"]
        if "__verbose" in chunk and self.verbose is None:
            self.verbose = chunk["__verbose"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            if not isinstance(index, int) or isinstance(index, bool):
                index = position
            _apply_choice(self.choices.setdefault(index, _ChoiceState()), choice)

    def response(self) -> JsonObject | None:
        if not self.choices:
            return None
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message: dict[str, Any] = {"role": state.role, "content": "".join(state.content)}
            reasoning = "".join(state.reasoning)
            if reasoning:
                message["reasoning_content"] = reasoning
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
            choices.append(
                {"index": index, "message": message, "finish_reason": state.finish_reason}
            )
        response: dict[str, Any] = {"object": "chat.completion", **self.meta, "choices": choices}
        if self.usage is not None:
            response["usage"] = self.usage
        if self.timings is not None:
            response["timings"] = self.timings
        if self.verbose is not None:
            response["__verbose"] = self.verbose
        stream_format = self.format.record(done=self.done, last_event=self.chunks)
        if stream_format is not None:
            response[STREAM_FORMAT_KEY] = stream_format
        return response


@dataclass
class _Reader:
    """The parse state of one transcript: the pending event and the streams so far."""

    file: str
    streams: list[StreamState] = field(default_factory=list)
    event_name: str | None = None
    data_lines: list[tuple[int, str]] = field(default_factory=list)
    events: int = 0

    def stream_for(self, number: int) -> StreamState:
        """The stream an event at line `number` belongs to: after [DONE], a new one."""
        if not self.streams or self.streams[-1].done:
            self.streams.append(StreamState(first_line=number))
        return self.streams[-1]


def _dispatch(reader: _Reader, *, at_eof: bool) -> None:
    """End of an event (blank line or end of input): handle its data lines."""
    data_lines, reader.data_lines = reader.data_lines, []
    if data_lines:
        reader.events += 1
        if len(data_lines) == 1:
            _handle_payload(reader, data_lines[0][1], data_lines[0][0], is_last=at_eof)
        else:
            payload = "\n".join(d for _, d in data_lines)
            try:
                value = _decode(payload, reader.file)
            except (ValueError, RecursionError):
                # Logs often lose the blank line between events: try the lines one by one.
                last = data_lines[-1][0]
                for number, item in data_lines:
                    _handle_payload(reader, item, number, is_last=at_eof and number == last)
            else:
                _handle_value(reader, value, data_lines[0][0])
    reader.event_name = None


def _handle_payload(reader: _Reader, payload: str, number: int, *, is_last: bool) -> None:
    stripped = payload.strip()
    if not stripped:
        return
    if stripped == "[DONE]":
        stream = reader.streams[-1] if reader.streams else reader.stream_for(number)
        stream.done = True
        return
    try:
        value = _decode(stripped, reader.file)
    except (ValueError, RecursionError):
        stream = reader.stream_for(number)
        if is_last:
            # The capture stops inside the last chunk: a stream cut off mid-event.
            stream.cut_mid_event = True
            return
        if reader.event_name == "error":
            stream.error = normalise_error(stripped, in_stream=True)
            return
        raise CaptureError(reader.file, number, "SSE data is not JSON") from None
    _handle_value(reader, value, number)


def _handle_value(reader: _Reader, value: Any, number: int) -> None:
    if not isinstance(value, dict):
        raise CaptureError(
            reader.file, number, f"SSE data must be a JSON object, got {json_type(value)}"
        )
    stream = reader.stream_for(number)
    if reader.event_name == "error" or ("error" in value and value["error"] is not None):
        stream.error = normalise_error(value.get("error", value), in_stream=True)
        return
    stream.apply(value, number)


def _bare_error(reader: _Reader, value: str, number: int) -> None:
    """Older llama-server builds: a bare `error:` field instead of `data: {"error": ...}`."""
    reader.events += 1
    stream = reader.stream_for(number)
    try:
        raw = json.loads(value, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raw = value
    if isinstance(raw, dict) and "error" in raw:
        raw = raw["error"]
    stream.error = normalise_error(raw, in_stream=True)


def _feed_line(reader: _Reader, line: str, number: int) -> None:
    if not line.strip():
        _dispatch(reader, at_eof=False)
        return
    if line.startswith(":"):
        return  # comment / keep-alive ping
    name, colon, value = line.partition(":")
    if not colon:
        name, value = line, ""
    elif value.startswith(" "):
        value = value[1:]
    name = name.strip()
    if name == "data":
        reader.data_lines.append((number, value))
    elif name == "event":
        reader.event_name = value.strip()
    elif name == "error":
        _bare_error(reader, value, number)


def _stream_body(stream: StreamState, file: str, status: int | None, where: int | None) -> Body:
    if not stream.choices and stream.error is None and not stream.cut_mid_event:
        if stream.done and stream.chunks == 0:
            raise CaptureError(file, None, "SSE transcript holds only [DONE], no chunks")
        raise CaptureError(file, where, "SSE transcript has no chat completion chunks")
    response = stream.response()
    finished = any(c.finish_reason for c in stream.choices.values())
    truncated = stream.error is None and (stream.cut_mid_event or not (stream.done or finished))
    return Body(
        response=redact_json(response) if response is not None else None,
        error=stream.error,
        status=status,
        truncated=truncated,
        stream=True,
    )


def reassemble_sse_streams(
    text: str, file: str, *, line_offset: int = 0, status: int | None = None
) -> list[tuple[int, Body]]:
    """Every stream of a transcript as (first line, body); one per `[DONE]`-ended reply."""
    reader = _Reader(file)
    for number, raw_line in enumerate(_lines(text), start=1 + line_offset):
        _feed_line(reader, raw_line.rstrip("\r"), number)
    _dispatch(reader, at_eof=True)
    if reader.events == 0:
        raise CaptureError(
            file, line_offset + 1 if line_offset else None, "SSE transcript has no data events"
        )
    if not reader.streams:
        raise CaptureError(file, None, "SSE transcript has no chat completion chunks")
    return [
        (s.first_line, _stream_body(s, file, status, s.first_line if n else None))
        for n, s in enumerate(reader.streams)
    ]


def reassemble_sse(
    text: str, file: str, *, line_offset: int = 0, status: int | None = None
) -> Body:
    """A transcript that must hold one reply (a response body inside another capture)."""
    streams = reassemble_sse_streams(text, file, line_offset=line_offset, status=status)
    if len(streams) > 1:
        raise CaptureError(
            file,
            streams[1][0],
            "data after `data: [DONE]`: this body holds a second stream (one reply expected)",
        )
    return streams[0][1]
