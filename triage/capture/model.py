"""The exchange model: `Exchange`, `CaptureError`, the input limits and schema validation."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

import kb
from kb.jsontypes import JsonObject

# The package, not its function: the catalogue is looked up per call (tests swap it).
from triage import catalogue as plugins
from triage.capture.redact import redact_text

__all__ = [
    "MAX_CAPTURE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_RESPONSE_TEXT_CHARS",
    "SCHEMA_VERSION",
    "CaptureError",
    "Exchange",
    "PartialCapture",
    "validate_exchange",
]

SCHEMA_VERSION = 1

# A capture is one exchange or a log of them; 32 MiB is far above any real chat exchange
# and keeps a mistaken `capture core.dump` from filling memory and the database.
MAX_CAPTURE_BYTES = 32 * 1024 * 1024
# Chat bodies nest a handful of levels (tool schemas a few more); a hard cap keeps the
# recursive walks (redaction, validation) far from Python's recursion limit.
MAX_JSON_DEPTH = 100
# Non-JSON bodies (an HTML proxy page, a plain-text 500) are kept only as a readable excerpt.
MAX_RESPONSE_TEXT_CHARS = 8192
# Exchanges built from live HTTP calls (probe replies) rather than from a capture file.
LIVE_FORMAT = "live"


def reject_constant(name: str) -> Any:
    """`parse_constant` for json.loads: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


class CaptureError(Exception):
    """Input that is not a valid capture; names the file and where in it (line or JSON path)."""

    def __init__(self, file: str, location: int | str | None, message: str) -> None:
        self.file = file
        self.location = location
        # Messages may quote input; scrub them like everything else that is shown.
        self.message = redact_text(message)
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.location is None or self.location == "":
            return f"{self.file}: {self.message}"
        if isinstance(self.location, int):
            return f"{self.file}:{self.location}: {self.message}"
        return f"{self.file}: {self.location}: {self.message}"


class PartialCapture(CaptureError):
    """A multi-record capture (JSONL, HAR) with bad records: names every one of them and
    keeps the good exchanges, so a caller may choose to go on without the bad ones
    (`--skip-bad`). Being a CaptureError, it is all-or-nothing for everyone else."""

    MAX_LISTED = 10

    def __init__(
        self, file: str, errors: list[CaptureError], good: list[Exchange], total: int
    ) -> None:
        self.errors = errors
        self.good = good
        self.total = total
        first, others = errors[0], errors[1:]
        message = first.message
        if others:
            listed = "; ".join(_where(error) for error in others[: self.MAX_LISTED])
            more = len(others) - self.MAX_LISTED
            message += f"; also {listed}" + (f"; and {more} more" if more > 0 else "")
        message += f" ({len(errors)} of {total} records bad"
        message += f"; --skip-bad keeps the {len(good)} good ones)" if good else ")"
        super().__init__(file, first.location, message)


def _where(error: CaptureError) -> str:
    location = error.location
    if isinstance(location, int):
        return f"line {location}: {error.message}"
    return f"{location}: {error.message}" if location else error.message


@dataclass
class Exchange:
    """One chat request and its response, normalised and redacted, with transport facts."""

    request: dict[str, Any]
    response: dict[str, Any] | None
    source_format: str
    source_file: str
    sha256: str
    index: int = 0
    location: str | None = None
    status: int | None = None
    elapsed_ms: float | None = None
    truncated: bool = False
    timed_out: bool = False
    stream: bool = False
    error: dict[str, Any] | None = None
    response_text: str | None = None
    url: str | None = None
    method: str | None = None
    request_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    http_timings: dict[str, float] | None = None
    # Client-view captures only: the server's answer re-assembled from the raw stream on the
    # wire, while `response` is what the client showed (see capture/formats/client_view.py).
    wire_response: dict[str, Any] | None = None

    def to_dict(self) -> JsonObject:
        """The JSON form stored as evidence (validates against exchange.schema.json)."""
        data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "request": self.request,
            "response": self.response,
            "response_text": self.response_text,
            "error": self.error,
            "status": self.status,
            "elapsed_ms": self.elapsed_ms,
            "truncated": self.truncated,
            "timed_out": self.timed_out,
            "stream": self.stream,
            "url": self.url,
            "method": self.method,
            "request_headers": self.request_headers,
            "response_headers": self.response_headers,
            "http_timings": self.http_timings,
            "source_format": self.source_format,
            "source_file": self.source_file,
            "sha256": self.sha256,
            "index": self.index,
            "location": self.location,
        }
        if self.wire_response is not None:  # absent otherwise: stored exchanges stay byte-stable
            data["wire_response"] = self.wire_response
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Exchange:
        """Rebuild an exchange from its stored form (validated first)."""
        errors = validate_exchange(data)
        if errors:
            raise CaptureError("<exchange>", errors[0][0], errors[0][1])
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


@functools.lru_cache(maxsize=1)
def _exchange_validator() -> jsonschema.protocols.Validator:
    path = Path(kb.__file__).parent / "schemas" / "exchange.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _known_formats() -> tuple[str, ...]:
    # The registry, not the schema, says which formats exist: a plugin format is valid.
    # Read from the catalogue here (in sniff order, as triage.capture.formats.format_ids
    # lists them): the formats package imports this module, not the other way round.
    registered = sorted(plugins.catalogue().formats, key=lambda f: (f.priority, f.id))
    return (*(f.id for f in registered), LIVE_FORMAT)


def validate_exchange(data: Any) -> list[tuple[str, str]]:
    """Schema violations of an exchange dict as (json_path, message); empty when valid."""
    validator = _exchange_validator()
    errors = list(validator.iter_errors(data))
    if not errors:
        source_format = data.get("source_format")
        known = _known_formats()
        if source_format not in known:
            return [
                (
                    "$.source_format",
                    f"{source_format!r} is not a registered capture format ({', '.join(known)})",
                )
            ]
        return []
    best = best_match(errors)
    ordered = [best] + [e for e in errors if e is not best]
    return [(e.json_path, e.message[:300]) for e in ordered]
