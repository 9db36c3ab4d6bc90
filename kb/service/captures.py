"""Captured exchanges as evidence: store them in batches (content seen before is not stored
again), list the ones attached to no incident, attach them to an incident later.

Each batch is one transaction: a large capture holds the write lock one batch at a time,
and a capture cut short keeps its whole batches; running it again stores the rest (the
content hashes skip what is already there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session

from kb.jsontypes import JsonObject
from kb.repo.store import (
    CONTENT_HASH,
    EvidenceItem,
    add_evidence_many,
    attach_evidence,
    exchange_hashes,
    get_incident,
    last_evidence_id,
    orphan_evidence,
)
from kb.service.core import KnowledgeBase
from kb.service.errors import NotFoundError

__all__ = [
    "Attached",
    "CapturedExchange",
    "OrphanEvidence",
    "StoredCaptures",
    "attach_orphans",
    "orphans",
    "store_captures",
]


@dataclass(frozen=True)
class CapturedExchange:
    """One captured exchange to store: the redacted exchange and its findings as stored,
    its content hash (kb.repo.store.exchange_content_hash) and where it came from."""

    exchange: JsonObject  # the exchange as a capture file holds it
    findings: list[JsonObject]  # Finding.to_dict() of every check
    symptoms: list[str]
    digest: str
    summary: str
    source: str


@dataclass
class StoredCaptures:
    """Evidence key per captured position, and the positions whose content was there."""

    keys: dict[int, str] = field(default_factory=dict)
    duplicates: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class OrphanEvidence:
    """A piece of evidence attached to no incident."""

    key: str
    kind: str
    recorded_at: datetime
    source: str
    summary: str


@dataclass(frozen=True)
class Attached:
    """An orphan attached to an incident: its old key, its key there, and whether the
    incident already held the same exchange (the orphan was removed instead)."""

    orphan: str
    key: str
    duplicate: bool


@dataclass
class _Held:
    """The content hashes already stored, read incrementally batch after batch."""

    hashes: dict[str, str]
    last_id: int = 0


def _incident_id(session: Session, slug: str | None) -> int | None:
    if not slug:
        return None
    incident = get_incident(session, slug)
    if incident is None:
        raise NotFoundError(f"no incident with slug {slug!r}")
    return incident.id


def _batches(count: int, size: int) -> Iterator[range]:
    for start in range(0, count, size):
        yield range(start, min(start + size, count))


def store_captures(
    kb: KnowledgeBase,
    items: Sequence[CapturedExchange],
    incident: str | None,
    *,
    batch: int,
    progress: Callable[[int, int], None] | None = None,
) -> StoredCaptures:
    """Store each exchange unless its content is already stored (on the incident, or among
    the captures attached to none), `batch` per transaction; `progress(done, total)` after
    each committed batch."""
    stored = StoredCaptures()
    seen = _Held({})
    done = 0
    for positions in _batches(len(items), batch):
        with kb.transaction() as session:
            last_id = _store_batch(session, items, positions, incident, stored, seen)
        seen.last_id = last_id  # committed: the next batch reads the rows stored after it
        done += len(positions)
        if progress is not None:
            progress(done, len(items))
    return stored


def _store_batch(
    session: Session,
    items: Sequence[CapturedExchange],
    positions: range,
    incident: str | None,
    stored: StoredCaptures,
    seen: _Held,
) -> int:
    """One batch, in the caller's transaction; the last evidence id before it."""
    keys, duplicates = stored.keys, stored.duplicates
    incident_id = _incident_id(session, incident)
    # What was stored since the previous batch (another capture may have stored some of
    # these exchanges meanwhile); the whole set on the first batch.
    last_id = last_evidence_id(session)
    seen.hashes.update(exchange_hashes(session, incident_id, after_id=seen.last_id))
    held = {**seen.hashes}
    pending: list[tuple[int, str, EvidenceItem]] = []
    for n in positions:
        item = items[n]
        if item.digest in held:
            keys[n] = held[item.digest]
            duplicates.add(n)
            continue
        held[item.digest] = ""  # a repeat inside this batch: filled in below
        spec = EvidenceItem(
            kind="exchange",
            summary=item.summary,
            payload={
                "exchange": item.exchange,
                "findings": item.findings,
                "symptoms": item.symptoms,
                CONTENT_HASH: item.digest,
            },
            source=item.source,
        )
        pending.append((n, item.digest, spec))
    rows = add_evidence_many(session, incident_id, [spec for *_, spec in pending])
    for (n, digest, _spec), row in zip(pending, rows, strict=True):
        keys[n] = held[digest] = row.key
    for n in positions:  # repeats inside the batch name the row stored first
        if n in duplicates and not keys[n]:
            keys[n] = held[items[n].digest]
    return last_id


def orphans(kb: KnowledgeBase) -> list[OrphanEvidence]:
    """Evidence attached to no incident (captures stored without an incident), oldest first."""
    with kb.transaction(readonly=True) as session:
        return [
            OrphanEvidence(row.key, row.kind, row.recorded_at, row.source, row.summary)
            for row in orphan_evidence(session)
        ]


def attach_orphans(kb: KnowledgeBase, keys: Sequence[str], incident: str) -> list[Attached]:
    """Attach orphan evidence (`all`: every one) to an incident, renumbered in its key
    space; an exchange the incident already holds is not added twice. An unknown key or
    incident is an error naming it, and nothing is attached."""
    with kb.transaction() as session:
        incident_id = _incident_id(session, incident)
        assert incident_id is not None
        wanted = list(keys)
        if "all" in wanted:
            wanted = [row.key for row in orphan_evidence(session)]
        return [
            Attached(old, new, dup)
            for old, new, dup in attach_evidence(session, wanted, incident_id)
        ]
