"""The proxy's side of the knowledge base: one transaction per batch of recorded exchanges.

`record_live(kb, write)` runs `write(batch)` in one transaction and retries it when another
replica stored the same key or signature first; `LiveBatch` offers kb.repo.live's steps on
typed records (kb.domain.live: `LiveRow`, `LiveExample`, `DetectionFacts`, `LiveAlarm`) and
`ProblemRef` handles, so the proxy never holds a session or an ORM row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlmodel import Session

from kb.atlas.refs import add_references
from kb.domain.live import DetectionFacts, LiveAlarm, LiveExample, LiveRow, RateFacts
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
    "LiveAlarm",
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
        return set(kb_live.insert_exchanges(self._session, rows))

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
        update_detection(self._session, self._row(ref), facts)

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
        add_examples(self._session, self._row(ref), examples)

    def open_or_attach(self, alarm: LiveAlarm) -> tuple[ProblemRef, str]:
        """Open an incident for the alarm's problem, or attach it to one of its family: (its
        signature row, `opened` | `attached` | `existing`)."""
        row, outcome = open_or_attach(self._session, alarm)
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
