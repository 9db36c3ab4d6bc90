"""Capture format `vgw`: a vendor gateway's line log.

One event per line, `VGW/1 <time> <request id> <event> <rest>`:

    VGW/1 2026-12-01T03:00:00Z r-7f3a REQ POST /v1/chat/completions {"messages": [...]}
    VGW/1 2026-12-01T03:00:00Z r-7f3a HDR authorization: Bearer sk-...
    VGW/1 2026-12-01T03:00:09Z r-7f3a RES 200 9123ms {"choices": [...]}

`REQ` opens an exchange (method, path, JSON body), `HDR` adds a request header, `RES`
closes it (HTTP status, elapsed time, JSON body). Lines starting with `#` and blank lines
are skipped. Exchanges come out in the order their `REQ` lines appear; headers are
redacted by triage's capture layer (`exchange_from_record`) like any other format's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from triage.capture import CaptureError, CaptureFormat, Exchange, exchange_from_record

__all__ = ["FORMAT", "MAGIC", "parse_vgw", "sniff_vgw"]

MAGIC = "VGW/1 "
# Bounds besides the capture layer's file-size limit.
MAX_EXCHANGES = 10_000
MAX_HEADERS = 200
EVENTS = ("REQ", "HDR", "RES")


def sniff_vgw(text: str) -> bool:
    """Is the first line that is not blank or a comment a VGW/1 event?"""
    for line in text.lstrip("\ufeff").splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith(MAGIC)
    return False


def _json(text: str, file: str, line: int, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CaptureError(file, line, f"the {what} is not valid JSON: {exc}") from None


def _fields(line: str, file: str, number: int) -> tuple[str, str, str]:
    parts = line.split(" ", 4)
    if len(parts) < 5 or parts[0] != MAGIC.strip():
        raise CaptureError(file, number, "expected `VGW/1 <time> <request id> <event> ...`")
    _, _, request_id, event, rest = parts
    if event not in EVENTS:
        raise CaptureError(
            file, number, f"unknown event {event!r} (expected one of {', '.join(EVENTS)})"
        )
    return request_id, event, rest


def _response(rest: str, file: str, number: int) -> dict[str, Any]:
    parts = rest.split(" ", 2)
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].endswith("ms"):
        raise CaptureError(file, number, "expected `RES <status> <elapsed>ms <json body>`")
    try:
        elapsed = float(parts[1][:-2])
    except ValueError:
        raise CaptureError(file, number, f"elapsed time {parts[1]!r} is not a number") from None
    return {
        "status": int(parts[0]),
        "elapsed_ms": elapsed,
        "response": _json(parts[2], file, number, "response body"),
    }


def parse_vgw(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    """Every REQ..RES pair of the log as an exchange (CaptureError naming the line)."""
    open_: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        request_id, event, rest = _fields(line, file, number)
        record = open_.get(request_id)
        if event == "REQ":
            if record is not None:
                raise CaptureError(file, number, f"request {request_id!r} opened twice")
            if len(order) >= MAX_EXCHANGES:
                raise CaptureError(file, number, f"more than {MAX_EXCHANGES} exchanges")
            method, _, tail = rest.partition(" ")
            path, _, body = tail.partition(" ")
            open_[request_id] = {
                "method": method,
                "url": path,
                "line": number,
                "request": _json(body, file, number, "request body"),
                "request_headers": {},
            }
            order.append(request_id)
            continue
        if record is None or "response" in record:
            raise CaptureError(
                file, number, f"{event} for request {request_id!r}, which no open REQ line started"
            )
        if event == "HDR":
            name, sep, value = rest.partition(":")
            if not sep or not name.strip():
                raise CaptureError(file, number, "expected `HDR <name>: <value>`")
            if len(record["request_headers"]) >= MAX_HEADERS:
                raise CaptureError(file, number, f"more than {MAX_HEADERS} headers")
            record["request_headers"][name.strip()] = value.strip()
        else:
            record.update(_response(rest, file, number))
    exchanges = []
    for index, request_id in enumerate(order):
        record = open_[request_id]
        line = record.pop("line")
        if "response" not in record:
            raise CaptureError(file, line, f"request {request_id!r} has no RES line")
        exchanges.append(
            exchange_from_record(record, file=file, source_format=FORMAT.id, index=index, line=line)
        )
    return exchanges


FORMAT = CaptureFormat(
    id="vgw",
    label="vendor gateway line log (VGW/1 REQ/HDR/RES events)",
    suffixes=(".vgw",),
    priority=40,
    sniff=sniff_vgw,
    parse=parse_vgw,
)
