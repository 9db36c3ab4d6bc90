"""Format detection and the entry points that read any capture: `detect_format`, `parse`,
`load_file`, and `exchange_from_http` for live calls. Formats come from the catalogue."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triage.capture.body import exchange_from_record as _record_exchange
from triage.capture.common import finish, guarded, sha256_of
from triage.capture.formats import (
    CaptureFormat,
    forget_document,
    format_ids,
    formats_by_priority,
    get_format,
)
from triage.capture.formats.curl import parse_curl
from triage.capture.formats.journal import parse_journal
from triage.capture.formats.pair import pair_role, parse_pair, parse_pair_document
from triage.capture.formats.sse import parse_sse_streams
from triage.capture.model import LIVE_FORMAT, CaptureError, Exchange
from triage.capture.reading import decode, max_capture_bytes, read_file

__all__ = ["detect_format", "exchange_from_http", "exchange_from_record", "load_file", "parse"]

# Exchanges from the built-in formats are validated where they are built.
_BUILTIN_MODULE_PREFIX = "triage.capture."


def _sniff_text(data: bytes | str) -> str:
    if isinstance(data, (bytes, bytearray)):
        text = bytes(data[: max_capture_bytes()]).decode("utf-8", "replace")
    else:
        text = data
    return text.lstrip("\ufeff")


def _sniffed(fmt: CaptureFormat, text: str, file: str) -> bool:
    try:
        return bool(fmt.sniff(text))
    except Exception as exc:  # a plugin's sniffer must not take detection down silently
        raise CaptureError(
            file or "<input>", None, f"format {fmt.id!r} failed to sniff ({type(exc).__name__})"
        ) from None


@guarded
def detect_format(data: bytes | str, file: str = "") -> str:
    """Best guess of a capture's format: a registered format id, or request|response.

    `request` and `response` are bare bodies that need their other half (see `load_file`).
    A file suffix a format claims decides outright; otherwise each format's sniffer is
    tried in priority order, and `pair` is the fallback.
    """
    formats = formats_by_priority()
    suffix = Path(file).suffix.lower() if file else ""
    if suffix:
        for fmt in formats:
            if suffix in fmt.suffixes:
                return fmt.id
    text = _sniff_text(data)
    if not text.strip():
        return "pair"
    try:
        chosen = next((f.id for f in formats if _sniffed(f, text, file)), "pair")
        return pair_role(text) if chosen == "pair" else chosen
    finally:
        forget_document()


def _as_text(data: bytes | str, file: str) -> str:
    """The decoded input for a format's `parse` (limits and UTF-8 checked; a BOM is kept so
    the format hashes exactly the bytes of the file)."""
    text, raw = decode(data, file)
    if isinstance(data, str):
        return data
    return raw.decode("utf-8") if raw.startswith(b"\xef\xbb\xbf") else text


def _run_format(
    fmt: CaptureFormat, data: bytes | str, file: str, base_dir: Path | None
) -> list[Exchange]:
    exchanges = fmt.parse_text(_as_text(data, file), file=file, base_dir=base_dir)
    if not isinstance(exchanges, list) or not all(isinstance(e, Exchange) for e in exchanges):
        raise CaptureError(file, None, f"format {fmt.id!r} did not return a list of exchanges")
    if not getattr(fmt.parse, "__module__", "").startswith(_BUILTIN_MODULE_PREFIX):
        exchanges = [finish(exchange, file) for exchange in exchanges]
    return exchanges


def _parse_bare(
    data: bytes | str,
    kind: str,
    *,
    file: str,
    response: bytes | str | None,
    response_file: str | None,
    request: bytes | str | None,
    request_file: str | None,
) -> list[Exchange]:
    """Bare request/response bodies and explicit pairs, with their companion file."""
    if kind == "request":
        if response is None:
            raise CaptureError(
                file, None, "this is a request body; give its response too (--response FILE)"
            )
        return [parse_pair(data, response, file=response_file or file, request_file=file)]
    if kind == "response":
        return [parse_pair(request, data, file=file, request_file=request_file)]
    # pair: a {"request":..,"response":..} document, or a request with --response
    if response is not None:
        return [parse_pair(data, response, file=response_file or file, request_file=file)]
    if request is not None:
        return [parse_pair(request, data, file=file, request_file=request_file)]
    return [parse_pair_document(data, file=file)]


@guarded
def parse(
    data: bytes | str,
    *,
    format: str = "auto",
    file: str = "<input>",
    response: bytes | str | None = None,
    response_file: str | None = None,
    request: bytes | str | None = None,
    request_file: str | None = None,
    base_dir: str | Path | None = None,
) -> list[Exchange]:
    """Parse one capture in the given (or detected) format into exchanges."""
    known = format_ids()
    if format not in ("auto", *known):
        raise CaptureError(
            file, None, f"unknown format {format!r} (expected auto or one of {', '.join(known)})"
        )
    kind = detect_format(data, file) if format == "auto" else format
    base = Path(base_dir) if base_dir is not None else None
    if kind == "curl":
        return [parse_curl(data, response, file=file, response_file=response_file, base_dir=base)]
    if kind == "journal":  # binary frames: read as bytes, not decoded as text first
        return parse_journal(data, file=file)
    if kind == "sse" and request is not None:
        return parse_sse_streams(data, file=file, request=request, request_file=request_file)
    if kind in ("request", "response", "pair"):
        return _parse_bare(
            data,
            kind,
            file=file,
            response=response,
            response_file=response_file,
            request=request,
            request_file=request_file,
        )
    fmt = get_format(kind)
    if fmt is None:
        raise CaptureError(file, None, f"no capture format {kind!r} is registered")
    return _run_format(fmt, data, file, base)


@guarded
def load_file(
    path: str | Path,
    *,
    format: str = "auto",
    response: str | Path | None = None,
    request: str | Path | None = None,
) -> list[Exchange]:
    """Read a capture file (and its companion response/request file) into exchanges."""
    name = str(path)
    data = read_file(path)
    response_data = read_file(response) if response is not None else None
    request_data = read_file(request) if request is not None else None
    return parse(
        data,
        format=format,
        file=name,
        response=response_data,
        response_file=str(response) if response is not None else None,
        request=request_data,
        request_file=str(request) if request is not None else None,
        base_dir=Path(path).parent,
    )


@guarded
def exchange_from_http(
    request: Mapping[str, Any],
    body: bytes | str | Mapping[str, Any] | None,
    *,
    status: int | None = None,
    elapsed_ms: float | None = None,
    timed_out: bool = False,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    response_headers: Mapping[str, str] | None = None,
    source_file: str = "live",
    index: int = 0,
) -> Exchange:
    """An exchange from a live HTTP call (probe replies): body as received, JSON or SSE."""
    record: dict[str, Any] = {
        "request": dict(request),
        "response": dict(body) if isinstance(body, Mapping) else body,
        "status": status,
        "elapsed_ms": elapsed_ms,
        "timed_out": timed_out,
        "url": url,
        "method": "POST",
    }
    if headers is not None:
        record["request_headers"] = dict(headers)
    if response_headers is not None:
        record["response_headers"] = dict(response_headers)
    if isinstance(body, (bytes, bytearray)):
        text, _ = decode(bytes(body), source_file)
        record["response"] = text
    raw = json.dumps(record, sort_keys=True, default=str).encode()
    digest = sha256_of(raw)
    return _record_exchange(
        record, source_file, sha256=digest, index=index, line=None, source_format=LIVE_FORMAT
    )


@guarded
def exchange_from_record(
    record: Mapping[str, Any],
    *,
    file: str,
    source_format: str,
    index: int = 0,
    line: int | None = None,
    sha256: str | None = None,
) -> Exchange:
    """A plugin format's building block: one `{"request":..., "response":..., "status",
    "elapsed_ms", "error", "url", "request_headers", ...}` record (the JSONL shape) as a
    redacted, validated exchange. `sha256` defaults to the hash of the record's JSON."""
    if sha256 is None:
        sha256 = sha256_of(json.dumps(record, sort_keys=True, default=str).encode())
    return _record_exchange(
        dict(record), file, sha256=sha256, index=index, line=line, source_format=source_format
    )
