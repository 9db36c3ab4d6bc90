"""Capture formats: the protocol a format plugin implements, and the registry lookups.

A format is one module with `register(catalogue)` adding a `CaptureFormat` to
`catalogue.formats`, listed in the `triage.plugins` entry-point group:

    FORMAT = CaptureFormat(
        id="myproxy",
        label="my proxy's JSON log",
        suffixes=(".myproxy",),
        priority=50,
        sniff=lambda text: text.startswith('{"myproxy":'),
        parse=parse_myproxy,   # (text, *, file, base_dir) -> list[Exchange]
    )

    def register(catalogue):
        catalogue.formats.add(FORMAT)

`parse` raises `CaptureError` only; build exchanges with `source_format=FORMAT.id`.
Detection tries the suffixes first, then each format's `sniff` in `priority` order (lower
first) on the decoded text; the built-in `pair` format is the fallback (priority 1000).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The package, not its function: the catalogue is looked up per call (tests swap it).
from triage import catalogue as plugins
from triage.capture.model import Exchange, reject_constant

__all__ = [
    "CaptureFormat",
    "forget_document",
    "format_ids",
    "formats_by_priority",
    "get_format",
    "json_document",
]


@dataclass(frozen=True)
class CaptureFormat:
    """One capture format: how to recognise it and how to turn it into exchanges."""

    id: str
    label: str
    suffixes: tuple[str, ...]
    priority: int
    sniff: Callable[[str], bool]
    parse: Callable[..., list[Exchange]]

    def parse_text(self, text: str, *, file: str, base_dir: Path | None) -> list[Exchange]:
        """Call `parse` with the protocol's keyword arguments."""
        return self.parse(text, file=file, base_dir=base_dir)


def _section() -> Any:
    return plugins.catalogue().formats


def formats_by_priority() -> list[CaptureFormat]:
    """Every registered format, in sniff order (priority, then id)."""
    return sorted(_section(), key=lambda f: (f.priority, f.id))


def format_ids() -> tuple[str, ...]:
    """The registered format ids, in sniff order (what `--format` and the UI offer)."""
    return tuple(f.id for f in formats_by_priority())


def get_format(format_id: str) -> CaptureFormat | None:
    """The registered format with this id, or None."""
    found: CaptureFormat | None = _section().get(format_id)
    return found


# Several sniffers look at the same JSON document; parse it once per text.
_last_document: tuple[str, Any] | None = None


def json_document(text: str) -> Any:
    """The text parsed as one JSON value (None when it is not JSON), cached for the last text."""
    global _last_document
    if _last_document is not None and _last_document[0] is text:
        return _last_document[1]
    stripped = text.strip()
    value = None
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped, parse_constant=reject_constant)
        except (ValueError, RecursionError):
            value = None
    _last_document = (text, value)
    return value


def forget_document() -> None:
    """Drop the cached document (detection is over; do not keep a large capture alive)."""
    global _last_document
    _last_document = None
