"""The proxy's side of the knowledge base: one transaction per batch of recorded exchanges.

`record_live(kb, write)` runs `write(batch)` in one transaction and retries it when another
replica stored the same key or signature first; `LiveBatch` offers kb.repo.live's steps on
typed records (`LiveRow`, `LiveExample`, `DetectionFacts`) and `ProblemRef` handles, so the
proxy never holds a session or an ORM row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NotRequired, TypedDict, TypeVar

from sqlmodel import Session

from kb.atlas.refs import add_references
from kb.jsontypes import JsonObject
from kb.models import Incident, LiveSignature
from kb.repo import live as kb_live
from kb.repo.live import ShapeCounts
from kb.repo.liveincidents import (
    add_examples,
    add_variant,
    find_problem,
    find_signature,
    open_or_attach,
    update_detection,
)
from kb.service.core import KnowledgeBase
from kb.service.errors import ConflictError, NotFoundError

__all__ = [
    "DetectionFacts",
    "LiveBatch",
    "LiveExample",
    "LiveRow",
    "ProblemRef",
    "RateFacts",
    "ShapeCounts",
    "record_live",
]

T = TypeVar("T")
WRITE_ATTEMPTS = 3


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
    incident's first example, `brief` for the others (kb.repo.live.add_examples)."""

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
class ProblemRef:
    """A live problem's signature row: its signature and the incident it belongs to."""

    id: int
    signature: str
    incident_id: int


def _ref(row: LiveSignature) -> ProblemRef:
    assert row.id is not None
    return ProblemRef(id=row.id, signature=row.signature, incident_id=row.incident_id)


class LiveBatch:
    """kb.repo.live's steps inside one transaction of the proxy's writer."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _row(self, ref: ProblemRef) -> LiveSignature:
        row = self._session.get(LiveSignature, ref.id)
        if row is None:
            raise NotFoundError(f"no live signature row {ref.id}")
        return row

    def insert_exchanges(self, rows: Sequence[LiveRow]) -> set[str]:
        """Store the exchanges (keys already stored are skipped); the keys inserted."""
        return set(kb_live.insert_exchanges(self._session, [dict(row) for row in rows]))

    def shape_counts(self, model: str, shape: str, since: datetime, until: datetime) -> ShapeCounts:
        return kb_live.shape_counts(self._session, model, shape, since, until)

    def find_problem(self, model: str, problem: str) -> ProblemRef | None:
        row = find_problem(self._session, model, problem)
        return _ref(row) if row is not None else None

    def find_signature(self, model: str, signature: str) -> ProblemRef | None:
        row = find_signature(self._session, model, signature)
        return _ref(row) if row is not None else None

    def first_failing(
        self, model: str, signature: str, since: datetime, shape: str | None = None
    ) -> tuple[str, datetime, JsonObject | None] | None:
        """(live key, when, stored payload) of the earliest failing exchange since `since`."""
        return kb_live.first_failing(self._session, model, signature, since, shape)

    def update_detection(self, ref: ProblemRef, facts: DetectionFacts) -> None:
        update_detection(self._session, self._row(ref), dict(facts))

    def add_variant(
        self, ref: ProblemRef, *, signature: str, kinds: Iterable[str], shape: str, by: str
    ) -> None:
        add_variant(
            self._session,
            self._row(ref),
            signature=signature,
            kinds=kinds,
            shape=shape,
            opened_by=by,
        )

    def add_examples(self, ref: ProblemRef, examples: Sequence[LiveExample]) -> None:
        add_examples(self._session, self._row(ref), [dict(e) for e in examples])

    def open_or_attach(
        self,
        *,
        model: str,
        signature: str,
        kinds: Iterable[str],
        title: str,
        summary: str,
        upstream: JsonObject,
        facts: DetectionFacts,
        examples: Sequence[LiveExample],
        by: str,
        shape: str,
        problem: str,
    ) -> tuple[ProblemRef, str]:
        """Open an incident for the problem, or attach it to one of its family: (its
        signature row, `opened` | `attached` | `existing`)."""
        row, outcome = open_or_attach(
            self._session,
            model=model,
            signature=signature,
            kinds=kinds,
            title=title,
            summary=summary,
            upstream=upstream,
            detection=dict(facts),
            examples=[dict(e) for e in examples],
            opened_by=by,
            shape=shape,
            problem=problem,
        )
        return _ref(row), outcome

    def incident_slug(self, incident_id: int) -> str:
        incident = self._session.get(Incident, incident_id)
        if incident is None:
            raise NotFoundError(f"no incident with id {incident_id}")
        return incident.slug

    def add_references(self, incident_id: int, rows: Iterable[Mapping[str, str]]) -> list[str]:
        """Atlas pointers shown with the incident (one with the same url is not repeated)."""
        return add_references(self._session, incident_id, rows)


def record_live(kb: KnowledgeBase, write: Callable[[LiveBatch], T]) -> T:
    """Run `write` in one transaction; when a replica stored the same key or signature
    between our read and our write (ConflictError), run it again: the retry finds its rows.
    Database failures arrive as DatabaseError (the proxy spools the batch)."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            with kb.transaction() as session:
                return write(LiveBatch(session))
        except ConflictError:
            if attempt == WRITE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
