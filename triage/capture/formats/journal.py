"""The `journal` format: a segment of `triage proxy`'s journal (`<pid>-<start>-<n>.journal`),
every exchange the proxy answered in one stretch of a session, in order.

A segment is a run of frames: a 4-byte big-endian payload length, the CRC32 of the payload,
the payload (ASCII JSON: the forwarder's record with the bodies as text, its secrets already
redacted by the proxy; triage/proxy/journal.py writes it). Read here independently of the
proxy (the capture layer does not import it): each record of a chat, embeddings or rerank
path becomes an exchange (`record N` is its location); other paths (`/health`, `/v1/models`)
are skipped. A frame whose length runs past the end of the file, whose CRC does not match or
whose payload is not a record is an error naming the record and its byte offset (a write
cut by a crash leaves one at the end; the exchanges before it are kept for `--skip-bad`).
Bounded like every capture: the file by MAX_CAPTURE_BYTES, each JSON value by MAX_JSON_DEPTH.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

from kb.jsontypes import JsonObject
from triage.capture.body import exchange_from_record
from triage.capture.common import check_depth, guarded, sha256_of
from triage.capture.formats import CaptureFormat
from triage.capture.model import CaptureError, Exchange, PartialCapture, reject_constant
from triage.capture.reading import max_capture_bytes

__all__ = ["FORMAT", "parse_journal", "register"]

_HEADER = struct.Struct(">II")
_CHAT_PATH = re.compile(r"/(?:chat/completions|completions?|embeddings|rerank(?:ing)?)/?$")
_PAIR_FIELDS = ("request_headers", "response_headers")


def _frames(raw: bytes, file: str) -> tuple[list[tuple[int, int, bytes]], CaptureError | None]:
    """(record number, byte offset, payload) of each whole frame, and the error that ended
    the reading early (None: the file ends on a frame boundary)."""
    frames: list[tuple[int, int, bytes]] = []
    offset = 0
    while offset < len(raw):
        where = f"record {len(frames)} (byte {offset})"
        if len(raw) - offset < _HEADER.size:
            return frames, CaptureError(file, where, "a frame header cut short")
        length, crc = _HEADER.unpack_from(raw, offset)
        start = offset + _HEADER.size
        if length > len(raw) - start:
            return frames, CaptureError(
                file, where, f"a frame of {length} bytes runs past the end of the file"
            )
        payload = raw[start : start + length]
        if zlib.crc32(payload) != crc:
            return frames, CaptureError(file, where, "the frame's checksum does not match")
        frames.append((len(frames), offset, payload))
        offset = start + length
    return frames, None


def _pairs(value: Any) -> dict[str, str]:
    if not isinstance(value, list):
        return {}
    return {
        str(pair[0]): str(pair[1])
        for pair in value
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    }


def _record(payload: bytes, file: str, where: str) -> JsonObject | None:
    """The exchange record of one journal record; None when its path is not a chat one."""
    try:
        data = json.loads(payload.decode("ascii"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CaptureError(file, where, "the payload is not a JSON record") from None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        raise CaptureError(file, where, "not a journal record (no `key`)")
    check_depth(data, file)
    path = data.get("path")
    if not isinstance(path, str) or not _CHAT_PATH.search(path.split("?", 1)[0]):
        return None
    body = data.get("request_body")
    try:
        request = json.loads(body if isinstance(body, str) else "", parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise CaptureError(file, f"{where}, $.request_body", "not a JSON request") from None
    response = data.get("response_chunks")
    transport = data.get("transport_error")
    return {
        "request": request,
        "response": response if isinstance(response, str) and response else None,
        "status": data.get("status") if isinstance(data.get("status"), int) else None,
        "elapsed_ms": data.get("elapsed_ms"),
        "timed_out": data.get("timed_out") is True,
        "error": str(transport) if transport else None,
        "url": path,
        "method": data.get("method") if isinstance(data.get("method"), str) else "POST",
        **{key: _pairs(data.get(key)) for key in _PAIR_FIELDS},
    }


@guarded
def parse_journal(data: bytes | str, *, file: str = "<journal>") -> list[Exchange]:
    """Every chat (embeddings, rerank) record of a proxy journal segment, in order."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)
    limit = max_capture_bytes()
    if len(raw) > limit:
        raise CaptureError(file, None, f"file is {len(raw)} bytes, over the {limit} byte limit")
    if not raw:
        raise CaptureError(file, None, "empty file")
    digest = sha256_of(raw)
    frames, ended = _frames(raw, file)
    exchanges: list[Exchange] = []
    errors: list[CaptureError] = []
    for number, offset, payload in frames:
        where = f"record {number} (byte {offset})"
        try:
            record = _record(payload, file, where)
            if record is None:
                continue
            exchange = exchange_from_record(
                record,
                file,
                sha256=digest,
                index=len(exchanges),
                line=None,
                source_format="journal",
            )
        except CaptureError as exc:
            located: str = where
            if exc.location is not None and str(exc.location).startswith("record "):
                located = str(exc.location)  # _record named it already
            elif exc.location is not None and exc.location != "":
                located = f"{where}, {exc.location}"
            errors.append(CaptureError(file, located, exc.message))
            continue
        exchange.location = where
        exchanges.append(exchange)
    if ended is not None:  # the frame that ended the reading comes after every record read
        errors.append(ended)
    if errors:
        raise PartialCapture(file, errors, exchanges, len(exchanges) + len(errors))
    if not exchanges:
        raise CaptureError(
            file, None, "the journal has no chat/completions (embeddings, rerank) records"
        )
    return exchanges


def _sniff(text: str) -> bool:
    # Binary frames: detected by the `.journal` suffix or `--format journal`; a decoded
    # sniff sees the header bytes mangled, so only the first record's opening is checked.
    head = text[:64]
    at = head.find('{"key":"')
    return 2 <= at <= 8 and any(not c.isprintable() for c in head[:at])


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    return parse_journal(text, file=file)


FORMAT = CaptureFormat(
    id="journal",
    label="triage proxy journal segment (.journal)",
    suffixes=(".journal",),
    priority=35,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the journal format to the catalogue."""
    catalogue.formats.add(FORMAT)
