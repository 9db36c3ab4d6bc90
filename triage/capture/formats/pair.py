"""The `pair` format: a request body and its response, as one `{"request":..,
"response":..}` document or two files (the response may be JSON, SSE or `curl -i` output).
It is also the fallback when nothing else recognises the input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triage.capture.body import (
    exchange_from_record,
    is_tei_rerank_answer,
    parse_body,
    starts_with_status_line,
)
from triage.capture.common import (
    exchange_from_body,
    guarded,
    loads,
    request_body,
    sha256_of,
)
from triage.capture.formats import CaptureFormat, json_document
from triage.capture.model import CaptureError, Exchange
from triage.capture.reading import decode

__all__ = ["FORMAT", "pair_role", "parse_pair", "parse_pair_document", "register"]


def pair_role(text: str) -> str:
    """What a pair-format text is: `pair` (a whole document), or a bare `request` /
    `response` body that needs its other half."""
    stripped = text.lstrip("\ufeff").strip()
    if not stripped:
        return "pair"
    if starts_with_status_line(stripped):
        return "response"
    value = json_document(stripped) if stripped.startswith(("{", "[")) else None
    if is_tei_rerank_answer(value):
        return "response"  # a TEI-form /rerank answer: a bare list of {index, score}
    if isinstance(value, dict):
        if "request" in value and "response" in value:
            return "pair"
        if "choices" in value or "error" in value:
            return "response"
        if isinstance(value.get("data"), list) or isinstance(value.get("results"), list):
            return "response"  # /v1/embeddings, /v1/rerank
        if "messages" in value or "model" in value or "input" in value or "query" in value:
            return "request"
    return "pair"


@guarded
def parse_pair(
    request: bytes | str | None,
    response: bytes | str,
    *,
    file: str = "<pair>",
    request_file: str | None = None,
    status: int | None = None,
) -> Exchange:
    """A request body and a response body (JSON, SSE or `curl -i` output) as one exchange."""
    response_file = file
    request_file = request_file or file
    response_text, response_raw = decode(response, response_file)
    if request is not None:
        request_text, request_raw = decode(request, request_file)
        if not request_text.strip():
            raise CaptureError(request_file, None, "empty request file")
        body_value = loads(request_text, request_file, what="JSON request")
        request_value = request_body(body_value, request_file, "$")
        digest = sha256_of(request_raw, response_raw)
    else:
        request_value, digest = {}, sha256_of(response_raw)
    body = parse_body(response_text, response_file, status=status)
    return exchange_from_body(
        request_value, body, source_format="pair", file=response_file, sha256=digest, status=status
    )


@guarded
def parse_pair_document(data: bytes | str, *, file: str = "<pair>") -> Exchange:
    """A single JSON file {"request": ..., "response": ..., optional status/elapsed_ms}."""
    text, raw = decode(data, file)
    if not text.strip():
        raise CaptureError(file, None, "empty file")
    value = loads(text, file)
    return exchange_from_record(
        value, file, sha256=sha256_of(raw), index=0, line=None, source_format="pair"
    )


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    role = pair_role(text)
    if role == "request":
        raise CaptureError(
            file, None, "this is a request body; give its response too (--response FILE)"
        )
    if role == "response":
        return [parse_pair(None, text, file=file)]
    return [parse_pair_document(text, file=file)]


def _sniff(text: str) -> bool:
    return True  # the fallback: anything else is read as a pair (and refused clearly)


FORMAT = CaptureFormat(
    id="pair",
    label='JSON request/response pair ({"request":..,"response":..} or two files)',
    suffixes=(),
    priority=1000,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the pair format to the catalogue."""
    catalogue.formats.add(FORMAT)
