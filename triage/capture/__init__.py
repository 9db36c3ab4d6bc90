"""Ingest a failing exchange: JSON pair, curl command, SSE transcript, HAR 1.2, JSONL, or
any format a plugin registers in the catalogue.

Every input becomes an `Exchange`: the chat request, the (re-assembled) response and the
transport facts, validated against `kb/schemas/exchange.schema.json` and redacted before
anything else sees it. Parsers raise `CaptureError(file, location, message)` and nothing
else, whatever the input.

Rooms: `model` (Exchange, CaptureError, limits, validation), `redact`, `reading` (bounded
reads, decoding), `common` and `body` (shared HTTP/body helpers), `stream` (SSE
re-assembly), `formats/` (one module per format, each a registered `CaptureFormat`),
`dispatch` (detection and the entry points).
"""

from __future__ import annotations

from typing import Any

from triage.capture.dispatch import (
    detect_format,
    exchange_from_http,
    exchange_from_record,
    load_file,
    parse,
)
from triage.capture.formats import CaptureFormat, format_ids
from triage.capture.formats.curl import parse_curl
from triage.capture.formats.har import parse_har
from triage.capture.formats.jsonl import parse_jsonl
from triage.capture.formats.pair import parse_pair, parse_pair_document
from triage.capture.formats.sse import parse_sse, parse_sse_streams
from triage.capture.model import (
    MAX_CAPTURE_BYTES,
    CaptureError,
    Exchange,
    PartialCapture,
    validate_exchange,
)
from triage.capture.reading import read_file
from triage.capture.redact import (
    redact_args,
    redact_headers,
    redact_json,
    redact_text,
    redact_url,
    redaction_marker,
)

__all__ = [
    "FORMATS",
    "MAX_CAPTURE_BYTES",
    "CaptureError",
    "CaptureFormat",
    "Exchange",
    "PartialCapture",
    "detect_format",
    "exchange_from_http",
    "exchange_from_record",
    "format_ids",
    "load_file",
    "parse",
    "parse_curl",
    "parse_har",
    "parse_jsonl",
    "parse_pair",
    "parse_pair_document",
    "parse_sse",
    "parse_sse_streams",
    "read_file",
    "redact_args",
    "redact_headers",
    "redact_json",
    "redact_text",
    "redact_url",
    "redaction_marker",
    "validate_exchange",
]


def __getattr__(name: str) -> Any:
    # FORMATS reads the catalogue when asked (not at import: plugins may import us).
    if name == "FORMATS":
        return format_ids()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
