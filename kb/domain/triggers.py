"""Revisit triggers (pure): the trigger record as in an incident file, the registry of trigger
kinds, the state a checked trigger reports, and the value rules the kinds share (build
numbers, dates, failed captures). The built-in kinds, which read the store, and the
`register` entry point are in kb.triggers."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any, Protocol, TypedDict, cast

from kb.domain.errors import StoreError
from kb.jsontypes import JsonObject
from kb.vocab import BUILD_KEYS as VOCAB_BUILD_KEYS
from kb.vocab import WEIGHTS_KEYS as VOCAB_WEIGHTS_KEYS

__all__ = [
    "BUILD_KEYS",
    "DEFAULT_MIN_CAPTURES",
    "WEIGHTS_KEYS",
    "DecisionError",
    "KindLookup",
    "Trigger",
    "TriggerState",
    "as_date",
    "aware",
    "build_number",
    "capture_failed",
    "find_values",
    "ids",
    "labelled",
    "stored_trigger",
    "syntax",
]

DEFAULT_MIN_CAPTURES = 5

# Payload keys that carry a build or a weights hash, searched at any depth (kb/vocab.py).
BUILD_KEYS = VOCAB_BUILD_KEYS
WEIGHTS_KEYS = VOCAB_WEIGHTS_KEYS


class Trigger(TypedDict, total=False):
    """A revisit trigger as in an incident file and the decision's JSON column: `kind` first,
    then the kind's own keys as written (a plugin kind adds its own; every key is kept)."""

    kind: str
    note: str
    after: Any  # new-build: the build it waits to pass (a number, or text naming one)
    hash: str  # new-weights: the weights hash already seen
    threshold: Any  # failure-rate: a rate between 0 and 1 (checked by `normalise`)
    min_captures: Any  # failure-rate: at least this many new captures (checked likewise)
    on: Any  # date: YYYY-MM-DD (checked likewise)


def stored_trigger(value: JsonObject) -> Trigger:
    """A trigger as read back from where it was stored (the decision's JSON column, an
    incident file): written by `normalise`, so it has the Trigger shape."""
    return cast(Trigger, value)


class DecisionError(StoreError):
    """A decision the knowledge base refuses; the message says what is missing."""


def build_number(value: Any) -> int | None:
    """The build number in `11434`, `"11434"`, `"b11434"`, `"b11434-abc1234"`, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        match = re.match(r"^\s*(?:build\s*)?[bv]?(\d+)\b", value, re.IGNORECASE)
        if match:
            return int(match.group(1))
    return None


def as_date(value: Any, what: str) -> date:
    """A date from a date, datetime or YYYY-MM-DD text; DecisionError naming `what`."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise DecisionError(f"{what}: {value!r} is not a date (YYYY-MM-DD)")


def aware(value: datetime) -> datetime:
    # SQLite hands back naive values; the store writes UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def find_values(payload: Any, keys: Sequence[str], depth: int = 0) -> list[Any]:
    """Values under any of `keys` anywhere in a JSON payload (bounded depth)."""
    found: list[Any] = []
    if depth > 6:
        return found
    if isinstance(payload, dict):
        for key, value in payload.items():
            if key in keys and isinstance(value, (str, int)):
                found.append(value)
            elif isinstance(value, (dict, list)):
                found.extend(find_values(value, keys, depth + 1))
    elif isinstance(payload, list):
        for value in payload[:1000]:
            found.extend(find_values(value, keys, depth + 1))
    return found


def capture_failed(payload: JsonObject) -> bool | None:
    """Whether a captured exchange shows the failure: an explicit `failed`, else any finding
    that did not pass; None when the capture does not say."""
    failed = payload.get("failed")
    if isinstance(failed, bool):
        return failed
    findings = payload.get("findings")
    if isinstance(findings, list) and findings:
        verdicts = [f.get("passed") for f in findings if isinstance(f, dict)]
        if any(v is False for v in verdicts):
            return True
        if verdicts and all(v is True for v in verdicts):
            return False
    return None


@dataclass(frozen=True)
class TriggerState:
    """One revisit condition of a parked incident, checked against the record."""

    trigger: Trigger
    description: str
    fired: bool
    reason: str
    evidence_keys: tuple[str, ...] = ()


class KindLookup(Protocol):
    """What kb reads from a registry of trigger kinds (TriggerKinds, the catalogue section)."""

    def get(self, kind_id: str) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


def labelled(text: str, trigger: Trigger) -> str:
    """A trigger's description with its `note`, if any."""
    note = trigger.get("note")
    return f"{text} ({note})" if note else text


def ids(kinds: KindLookup) -> tuple[str, ...]:
    return tuple(kind.id for kind in kinds)


def syntax(kinds: KindLookup) -> str:
    """The `--when` syntax of every kind, for help texts and errors."""
    return " | ".join(kind.syntax for kind in kinds)
