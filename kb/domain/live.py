"""The live proxy's records as the knowledge base takes them (pure: no SQL, no I/O).

`LiveRow` is one recorded exchange, `LiveExample` a failing exchange to keep as an incident's
evidence, `DetectionFacts` the change detection stored with a live problem, and `LiveAlarm`
a problem that alarmed: the incident kb.repo.liveincidents opens, finds or attaches for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NotRequired, TypedDict

from kb.jsontypes import JsonObject

__all__ = ["DetectionFacts", "LiveAlarm", "LiveExample", "LiveRow", "RateFacts"]


class LiveRow(TypedDict):
    """One recorded exchange as the liveexchange table stores it (body compressed)."""

    key: str
    recorded_at: datetime
    replica: str
    path: str
    model: str
    client: str
    signature: str
    failed: bool
    status: int | None
    elapsed_ms: float | None
    stream: bool
    upstream_build: str
    template_sha256: str
    findings: list[str]
    body: bytes | None
    body_truncated: bool
    shape: str
    client_limit: str


class LiveExample(TypedDict):
    """A failing exchange to store as an incident's evidence: the whole payload for the
    incident's first example, `brief` for the others (kb.repo.liveincidents.add_examples)."""

    kind: str
    summary: str
    payload: JsonObject  # the evidence document as stored (redacted exchange, findings)
    source: str
    recorded_at: NotRequired[datetime]
    brief: JsonObject


class RateFacts(TypedDict):
    failures: int
    n: int
    rate: float
    interval: list[float]


class DetectionFacts(TypedDict):
    """The change detection of one live problem as stored with it and shown for it."""

    failures: int
    n: int
    trailing_failures: int
    trailing_n: int
    p0: float
    p1: float
    llr: float
    upper: float
    lower: float
    verdict: str  # alarm | no-change | continue
    new: bool
    rate: RateFacts
    as_of: str
    window_minutes: int
    shape: str
    variants: dict[str, int]


@dataclass(frozen=True)
class LiveAlarm:
    """A live failure signature (of `problem`, with its request `shape`) that alarmed: what
    the incident opened for it starts with, or what is added to the one it attaches to."""

    model: str
    signature: str
    kinds: tuple[str, ...]  # the failing finding kinds (a symptom each)
    title: str
    summary: str
    upstream: JsonObject  # the upstream identity as recorded in the latest example
    detection: DetectionFacts
    examples: tuple[LiveExample, ...]  # evidence items, oldest first (payload `live_key`)
    opened_by: str  # the replica
    shape: str = ""
    problem: str = ""
