"""The `sse` format: a streamed transcript (`curl -N` output, optionally with `-i` headers),
re-assembled into one exchange per stream; data after `data: [DONE]` is the next stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triage.capture.body import HTTP_STATUS_LINE, split_http_head
from triage.capture.common import (
    exchange_from_body,
    guarded,
    lines_before,
    loads,
    request_body,
    sha256_of,
)
from triage.capture.formats import CaptureFormat
from triage.capture.model import CaptureError, Exchange
from triage.capture.reading import decode
from triage.capture.stream import looks_like_sse, reassemble_sse_streams

__all__ = ["FORMAT", "parse_sse", "parse_sse_streams", "register"]


@guarded
def parse_sse_streams(
    data: bytes | str,
    *,
    file: str = "<sse>",
    request: bytes | str | None = None,
    request_file: str | None = None,
) -> list[Exchange]:
    """A streamed transcript (optionally with its request): one exchange per stream."""
    text, raw = decode(data, file)
    request_value: dict[str, Any] = {}
    parts = [raw]
    if request is not None:
        request_file = request_file or file
        request_text, request_raw = decode(request, request_file)
        request_value = request_body(
            loads(request_text, request_file, what="JSON request"), request_file, "$"
        )
        parts = [request_raw, raw]
    stripped = text.lstrip()
    status = None
    headers: dict[str, str] = {}
    offset = lines_before(text, len(text) - len(stripped))
    if HTTP_STATUS_LINE.match(stripped.split("\n", 1)[0].rstrip("\r")):
        status, headers, stripped, consumed = split_http_head(stripped, file)
        offset += consumed
    if not looks_like_sse(stripped):
        raise CaptureError(file, offset + 1, "not an SSE transcript (expected `data:` lines)")
    streams = reassemble_sse_streams(stripped, file, line_offset=offset, status=status)
    digest = sha256_of(*parts)
    exchanges = []
    for index, (first_line, body) in enumerate(streams):
        body.headers = headers
        exchanges.append(
            exchange_from_body(
                dict(request_value) if index else request_value,
                body,
                source_format="sse",
                file=file,
                sha256=digest,
                index=index,
                location=f"line {first_line}" if len(streams) > 1 else None,
            )
        )
    return exchanges


@guarded
def parse_sse(
    data: bytes | str,
    *,
    file: str = "<sse>",
    request: bytes | str | None = None,
    request_file: str | None = None,
) -> Exchange:
    """A streamed transcript holding one stream, reassembled into one exchange."""
    exchanges = parse_sse_streams(data, file=file, request=request, request_file=request_file)
    if len(exchanges) > 1:
        raise CaptureError(
            file,
            exchanges[1].location,
            f"the transcript holds {len(exchanges)} streams (data after `data: [DONE]`); "
            "read it with triage.capture.parse to get one exchange per stream",
        )
    return exchanges[0]


def _sniff(text: str) -> bool:
    stripped = text.lstrip("\ufeff").strip()
    if looks_like_sse(stripped):
        return True
    first = stripped.split("\n", 1)[0].rstrip("\r")
    return bool(HTTP_STATUS_LINE.match(first)) and "\ndata:" in stripped


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    return parse_sse_streams(text, file=file)


FORMAT = CaptureFormat(
    id="sse",
    label="SSE transcript of a streamed reply (curl -N output, with or without -i headers)",
    suffixes=(),
    priority=20,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the SSE format to the catalogue."""
    catalogue.formats.add(FORMAT)
