"""The `client-view` format: one streamed exchange seen twice -- the raw SSE stream as it
crossed the wire (a proxy's or tap's record) and what the client application made of it.

```json
{"request": {...},                      # the body the client sent (stream: true)
 "stream": "data: {...}\\n\\ndata: [DONE]\\n",   # the raw SSE text on the wire
 "client_view": {"content": "", "tool_calls": [], "reasoning_content": null,
                 "finish_reason": "tool_calls"}}  # what the client returned / showed
```

The exchange's `response` is the client's view (the failure the user saw, so the symptom
checks and the reproduction signature come from it); `wire_response` is the server's own
answer, re-assembled by triage's SSE reader from the raw stream, redacted like any body.
The `client-handling` cause compares the two (triage/engine/causes/client_handling.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kb.jsontypes import JsonObject
from triage.capture.common import sha256_of
from triage.capture.dispatch import exchange_from_record
from triage.capture.formats import CaptureFormat
from triage.capture.formats.sse import parse_sse
from triage.capture.model import MAX_JSON_DEPTH, CaptureError, Exchange
from triage.capture.redact import redact_json

__all__ = ["FORMAT", "KEY", "parse_client_view", "register"]

KEY = "client_view"
MESSAGE_FIELDS = ("content", "reasoning_content", "tool_calls")


def _depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    stack, deepest = [(value, 1)], 0
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > limit:
            return level
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _client_response(view: JsonObject, wire: JsonObject | None, file: str) -> Any:
    """The client's view as a chat.completion (what the symptom checks read)."""
    unknown = sorted(set(view) - {*MESSAGE_FIELDS, "finish_reason", "role"})
    if unknown:
        raise CaptureError(file, f"$.{KEY}", f"unknown field(s) {', '.join(unknown)}")
    content = view.get("content")
    if content is not None and not isinstance(content, str):
        raise CaptureError(file, f"$.{KEY}.content", "must be a string or null")
    calls = view.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise CaptureError(file, f"$.{KEY}.tool_calls", "must be a list or null")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if isinstance(view.get("reasoning_content"), str):
        message["reasoning_content"] = view["reasoning_content"]
    finish = view.get("finish_reason")
    if finish is None and wire is not None:  # the client did not record one: the wire's
        finish = (wire.get("choices") or [{}])[0].get("finish_reason")
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def parse_client_view(data: JsonObject, *, file: str) -> Exchange:
    """One client-view record as an exchange (response = the client's view)."""
    if _depth(data) > MAX_JSON_DEPTH:
        raise CaptureError(file, "$", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    request, stream, view = data.get("request"), data.get("stream"), data.get(KEY)
    if not isinstance(request, dict):
        raise CaptureError(file, "$.request", "required: the JSON body the client sent")
    if not isinstance(stream, str) or not stream.strip():
        raise CaptureError(file, "$.stream", "required: the raw SSE text seen on the wire")
    if not isinstance(view, dict):
        raise CaptureError(file, f"$.{KEY}", "required: an object (content, tool_calls, ...)")
    try:
        wire = parse_sse(stream, file=file, request=json.dumps(request))
    except CaptureError as exc:
        raise CaptureError(file, "$.stream", exc.message) from None
    wire_response = wire.response if isinstance(wire.response, dict) else None
    record = {
        "request": request,
        "response": _client_response(view, wire_response, file),
        "status": wire.status or 200,
    }
    digest = sha256_of(json.dumps(data, sort_keys=True).encode())
    exchange = exchange_from_record(record, file=file, source_format="client-view", sha256=digest)
    exchange.stream = True
    exchange.wire_response = redact_json(wire_response) if wire_response is not None else None
    return exchange


def _sniff(text: str) -> bool:
    head = text.lstrip("\ufeff").lstrip()
    return head.startswith("{") and f'"{KEY}"' in text and '"stream"' in text


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureError(file, exc.lineno, f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise CaptureError(file, "$", f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise CaptureError(file, "$", "a client-view capture is one JSON object")
    return [parse_client_view(data, file=file)]


FORMAT = CaptureFormat(
    id="client-view",
    label="a streamed exchange twice: the raw SSE on the wire and the client's view of it",
    suffixes=(),
    priority=10,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the client-view format to the catalogue."""
    catalogue.formats.add(FORMAT)
