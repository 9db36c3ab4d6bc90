"""The `jsonl` format: one `{"request":..., "response":...}` record per line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triage.capture.body import exchange_from_record
from triage.capture.common import guarded, loads, sha256_of
from triage.capture.formats import CaptureFormat, json_document
from triage.capture.model import CaptureError, Exchange, PartialCapture
from triage.capture.reading import decode

__all__ = ["FORMAT", "parse_jsonl", "register"]


@guarded
def parse_jsonl(data: bytes | str, *, file: str = "<jsonl>") -> list[Exchange]:
    """One exchange record per line (blank lines skipped). Bad lines raise one
    PartialCapture naming every bad line and holding the good exchanges."""
    text, raw = decode(data, file)
    digest = sha256_of(raw)
    exchanges: list[Exchange] = []
    errors: list[CaptureError] = []
    total = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        total += 1
        try:
            value = loads(line, file, line_offset=number - 1, what="JSON line")
            exchange = exchange_from_record(
                value, file, sha256=digest, index=len(exchanges), line=number, source_format="jsonl"
            )
        except CaptureError as exc:
            if exc.location is None:  # e.g. nesting: still name the line
                exc = CaptureError(file, number, exc.message)
            errors.append(exc)
            continue
        exchanges.append(exchange)
    if errors:
        raise PartialCapture(file, errors, exchanges, total)
    if not exchanges:
        raise CaptureError(file, None, "no exchanges (the file has no JSON lines)")
    return exchanges


def _sniff(text: str) -> bool:
    # Several JSON values on their own lines: the whole text is not one JSON document.
    stripped = text.strip()
    return stripped.startswith("{") and "\n" in stripped and json_document(text) is None


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    return parse_jsonl(text, file=file)


FORMAT = CaptureFormat(
    id="jsonl",
    label='JSONL log, one {"request":..,"response":..} record per line',
    suffixes=(".jsonl", ".ndjson"),
    priority=40,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the JSONL format to the catalogue."""
    catalogue.formats.add(FORMAT)
