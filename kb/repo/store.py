"""Engine, sessions and the write helpers every part of the product goes through.

SQLite by default (a file in the data directory), any SQLAlchemy URL via
`TRIAGE_DATABASE_URL` (PostgreSQL for a team). The schema is created and upgraded by
Alembic, never by `metadata.create_all`, so SQLite and PostgreSQL follow the same path.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import event, func
from sqlalchemy import inspect as sa_inspect
from sqlmodel import Session, col, select

from kb.domain.errors import StoreError
from kb.domain.slugs import unique_incident_slug
from kb.domain.textguard import TextLimit, check_text, redact_secret_phrases
from kb.jsontypes import JsonObject
from kb.models import (
    CAUSE_STATUSES,
    EVIDENCE_KINDS,
    Cause,
    CauseStatusChange,
    Decision,
    Evidence,
    EvidenceLink,
    FamilyLink,
    Incident,
    Reference,
    Symptom,
    utcnow,
)
from kb.repo import migrate
from kb.repo.engine import (
    check_url,
    database_url,
    make_engine,
    read_only_requested,
    redact_url,
    sqlite_file,
    sqlite_is_read_only,
)

# Free-text fields: their bound in characters; every one is also scrubbed of secret
# phrases ("password is X") before it is written (kb.domain.textguard). Checked on every flush, so
# every path -- the CLI, imports, the engine, the UI -- is bounded the same way.
TEXT_FIELDS: dict[type, dict[str, int]] = {
    Incident: {"title": 300, "summary": 20_000, "impact": 20_000, "body": 1_000_000},
    Symptom: {"description": 20_000},
    Cause: {"title": 1_000, "rationale": 20_000},
    Evidence: {"summary": 20_000},
    EvidenceLink: {"note": 20_000},
    CauseStatusChange: {"rationale": 20_000},
    Decision: {"rationale": 20_000, "tradeoff": 20_000, "fix": 20_000},
    Reference: {"title": 1_000, "note": 20_000},
    FamilyLink: {"note": 20_000},
}
# Bounded but not free text (names, not prose).
NAME_FIELDS: dict[type, dict[str, int]] = {
    Incident: {"model": 300, "weights": 300, "server_build": 100},
    CauseStatusChange: {"actor": 200},
    Decision: {"decided_by": 200},
}


def _changed(row: Any, attr: str, new: bool) -> bool:
    if new:
        return True
    history = sa_inspect(row).attrs[attr].history
    return bool(history.added)


def guard_text(row: Any, *, new: bool = True) -> None:
    """Bound, validate and redact the free-text fields of one row (StoreError names the
    field: `incident.title: 5,242,880 characters, at most 300`)."""
    table = re.sub(r"(?<!^)(?=[A-Z])", "_", type(row).__name__).lower()  # cause_status_change
    for fields, redact in ((TEXT_FIELDS, True), (NAME_FIELDS, False)):
        for attr, limit in fields.get(type(row), {}).items():
            value = getattr(row, attr, None)
            if not isinstance(value, str) or not _changed(row, attr, new):
                continue
            try:
                check_text(TextLimit(f"{table}.{attr}", limit), value)
            except ValueError as exc:
                raise StoreError(str(exc)) from None
            if redact:
                cleaned = redact_secret_phrases(value)
                if cleaned != value:
                    setattr(row, attr, cleaned)


@event.listens_for(Session, "before_flush")
def _guard_flush(session: Session, _context: Any, _instances: Any) -> None:
    for row in session.new:
        if type(row) in TEXT_FIELDS or type(row) in NAME_FIELDS:
            guard_text(row, new=True)
    for row in session.dirty:
        if type(row) in TEXT_FIELDS or type(row) in NAME_FIELDS:
            guard_text(row, new=False)


class ReadOnlyError(StoreError):
    """A read-only knowledge base whose schema is behind, or absent: it cannot be migrated."""


class Store:
    """The knowledge base: one engine, transactional sessions, migrations applied on open.

    `readonly` (default: `TRIAGE_READ_ONLY`, or a SQLite file this process cannot write)
    opens it for reading only: SQLite with `mode=ro` (`immutable=1` in a read-only
    directory), PostgreSQL with read-only transactions; nothing is migrated -- a schema
    behind this code's is a clear error -- and any write fails.
    """

    def __init__(
        self, url: str | None = None, *, migrate: bool = True, readonly: bool | None = None
    ) -> None:
        self.url = check_url(database_url(url))
        if readonly is None:
            path = sqlite_file(self.url)
            readonly = read_only_requested() or (path is not None and sqlite_is_read_only(path))
        self.readonly = readonly
        if readonly:
            path = sqlite_file(self.url)
            if path is not None and not path.is_file():
                raise ReadOnlyError(
                    f"no knowledge base at {path} (opened read-only: it cannot be created)"
                )
        self.engine = make_engine(self.url, readonly=readonly)
        if readonly:
            self._check_schema()
        elif migrate:
            self.upgrade()

    def _check_schema(self) -> None:
        current, head = migrate.current_revision(self.engine), migrate.head_revision()
        if current == head:
            return
        self.engine.dispose()
        where = redact_url(self.url)
        if current is None:
            raise ReadOnlyError(f"{where} holds no knowledge base (opened read-only)")
        raise ReadOnlyError(
            f"{where} is at schema revision {current}, this triage needs {head}; it is "
            "opened read-only so it cannot be upgraded: run any triage command once with "
            "write access to it"
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self, revision: str = "head") -> None:
        """Apply Alembic migrations up to `revision`."""
        migrate.upgrade(self.engine, revision)

    def downgrade(self, revision: str = "base") -> None:
        migrate.downgrade(self.engine, revision)

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back on any exception."""
        bind = self.engine.execution_options(triage_begin="DEFERRED") if readonly else self.engine
        with Session(bind, expire_on_commit=False) as session:
            with session.begin():
                yield session

    def close(self) -> None:
        self.engine.dispose()


def get_incident(session: Session, slug: str) -> Incident | None:
    return session.exec(select(Incident).where(Incident.slug == slug)).first()


TITLE_MAX = 300


def open_incident(
    session: Session, title: str, *, model: str = "", summary: str = "", opened_on: Any = None
) -> Incident:
    """Open an incident by hand (status open): its slug from the date and the title, ASCII
    and unique (`kb.domain.slugs`). Refuses an empty or over-long title or model."""
    title = title.strip()
    if not title:
        raise StoreError("title: must not be empty")
    if len(title) > TITLE_MAX:
        raise StoreError(f"title: {len(title):,} characters, at most {TITLE_MAX}")
    if len(model) > 300:
        raise StoreError(f"model: {len(model):,} characters, at most 300")
    try:
        check_text(TextLimit("title", TITLE_MAX), title)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    title = redact_secret_phrases(title)  # before the slug is made from it
    opened = opened_on or utcnow().date()
    slug = unique_incident_slug(
        opened, title, exists=lambda s: get_incident(session, s) is not None
    )
    incident = Incident(
        slug=slug, title=title, opened_on=opened, status="open", summary=summary, model=model
    )
    session.add(incident)
    session.flush()
    return incident


def require_incident(session: Session, slug: str) -> Incident:
    incident = get_incident(session, slug)
    if incident is None:
        raise StoreError(f"no incident with slug {slug!r}")
    return incident


def record_status_change(
    session: Session,
    cause: Cause,
    to_status: str,
    *,
    actor: str,
    rationale: str,
    evidence_keys: list[str] | None = None,
    at: datetime | None = None,
) -> CauseStatusChange:
    """Set a cause's status and append the history row; the only way a status changes."""
    if to_status not in CAUSE_STATUSES:
        raise StoreError(f"unknown cause status {to_status!r} (expected one of {CAUSE_STATUSES})")
    if not actor.strip():
        raise StoreError("a status change needs an actor")
    if not rationale.strip():
        raise StoreError("a status change needs a rationale")
    if cause.id is None:
        session.add(cause)
        session.flush()
    assert cause.id is not None
    keys = list(evidence_keys or [])
    if keys:
        known = set(
            session.exec(
                select(Evidence.key).where(
                    Evidence.incident_id == cause.incident_id,
                    Evidence.key.in_(keys),  # type: ignore[attr-defined]
                )
            ).all()
        )
        missing = [k for k in keys if k not in known]
        if missing:
            raise StoreError(f"cause {cause.key!r}: unknown evidence id(s) {missing}")
    history = session.exec(
        select(func.count())
        .select_from(CauseStatusChange)
        .where(CauseStatusChange.cause_id == cause.id)
    ).one()
    change = CauseStatusChange(
        cause_id=cause.id,
        from_status=cause.status if history else None,
        to_status=to_status,
        changed_at=at or utcnow(),
        actor=actor,
        rationale=rationale,
        evidence_keys=keys,
    )
    cause.status = to_status
    session.add(cause)
    session.add(change)
    session.flush()
    return change


def next_evidence_key(session: Session, incident_id: int | None, prefix: str = "E") -> str:
    """The next free `E<n>` key of an incident (or of the captures attached to none)."""
    return f"{prefix}{allocate_evidence_numbers(session, incident_id, 1, prefix)}"


def allocate_evidence_keys(
    session: Session, incident_id: int | None, count: int, prefix: str = "E"
) -> list[str]:
    """`count` consecutive free keys `E<n>` for one incident, numbering once.

    Within one transaction the numbering is scanned once and then continued, so storing
    N pieces of evidence costs one scan, not N (a 10k-entry HAR capture spent most of
    its time rescanning keys).
    """
    first = allocate_evidence_numbers(session, incident_id, count, prefix)
    return [f"{prefix}{first + offset}" for offset in range(count)]


# Arbitrary constant: the PostgreSQL advisory lock that serialises numbering the evidence
# attached to no incident (there is no incident row to lock).
_ORPHAN_EVIDENCE_LOCK = 0x7472_6961_6765


def _lock_numbering(session: Session, incident_id: int | None) -> None:
    """Make concurrent writers number one key space one after the other (PostgreSQL).

    Two writers numbering the same keys at once would both pick the same next key under
    READ COMMITTED. For an incident, its row is locked (FOR NO KEY UPDATE, as the search
    triggers of migration 0002 do); captures attached to no incident share one
    transaction-level advisory lock (the unique constraint on (incident_id, key) does not
    cover NULL incidents). Both are held until commit. SQLite writers are serialised by
    BEGIN IMMEDIATE already.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    if incident_id is not None:
        session.exec(
            select(Incident.id).where(Incident.id == incident_id).with_for_update(key_share=True)
        ).first()
    else:
        session.exec(select(func.pg_advisory_xact_lock(_ORPHAN_EVIDENCE_LOCK))).first()


def _numbering_cache(session: Session) -> dict[tuple[int | None, str], int]:
    """Next free number per (incident, prefix), valid for the current transaction only."""
    transaction = session.get_transaction()
    if transaction is None:  # no transaction yet (autobegin): nothing to reuse or keep
        return {}
    cached = session.info.get("triage_evidence_numbers")
    if cached is None or cached[0] is not transaction:
        cached = (transaction, {})
        session.info["triage_evidence_numbers"] = cached
    numbers: dict[tuple[int | None, str], int] = cached[1]
    return numbers


def allocate_evidence_numbers(
    session: Session, incident_id: int | None, count: int = 1, prefix: str = "E"
) -> int:
    """The first of `count` consecutive free evidence numbers, reserved for this transaction."""
    numbers = _numbering_cache(session)
    slot = (incident_id, prefix)
    if slot not in numbers:
        _lock_numbering(session, incident_id)
        numbers[slot] = _scan_next_number(session, incident_id, prefix)
    first = numbers[slot]
    numbers[slot] = first + count
    return first


def _scan_next_number(session: Session, incident_id: int | None, prefix: str) -> int:
    rows = session.exec(
        select(Evidence.key).where(
            Evidence.incident_id == incident_id
            if incident_id is not None
            else Evidence.incident_id.is_(None)  # type: ignore[union-attr]
        )
    ).all()
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    numbers = [int(m.group(1)) for k in rows if (m := pattern.match(k))]
    return max(numbers, default=0) + 1


def _note_explicit_key(session: Session, incident_id: int | None, key: str) -> None:
    """An explicitly keyed row (an import) moves the transaction's numbering past it."""
    match = re.match(r"^([A-Za-z]+)(\d+)$", key)
    if match is None:
        return
    numbers = _numbering_cache(session)
    slot = (incident_id, match.group(1))
    if slot in numbers:
        numbers[slot] = max(numbers[slot], int(match.group(2)) + 1)


def add_evidence(
    session: Session,
    *,
    incident_id: int | None,
    kind: str,
    summary: str,
    payload: JsonObject | None = None,
    source: str = "",
    key: str | None = None,
    run_id: int | None = None,
    recorded_at: datetime | None = None,
) -> Evidence:
    """Store one piece of evidence (auto key `E<n>` unless given)."""
    _check_evidence(kind, summary)
    if key:
        _note_explicit_key(session, incident_id, key)
    evidence = Evidence(
        incident_id=incident_id,
        key=key or next_evidence_key(session, incident_id),
        kind=kind,
        summary=summary,
        payload=payload or {},
        source=source,
        run_id=run_id,
        recorded_at=recorded_at or utcnow(),
    )
    session.add(evidence)
    session.flush()
    return evidence


def _check_evidence(kind: str, summary: str) -> None:
    if kind not in EVIDENCE_KINDS:
        raise StoreError(f"unknown evidence kind {kind!r} (expected one of {EVIDENCE_KINDS})")
    if not summary.strip():
        raise StoreError("evidence needs a summary")


@dataclass(frozen=True)
class EvidenceItem:
    """A piece of evidence to store (its key is numbered when it is stored)."""

    kind: str  # one of EVIDENCE_KINDS
    summary: str
    payload: JsonObject = field(default_factory=dict)  # the evidence document as stored
    source: str = ""
    recorded_at: datetime | None = None  # default: when it is stored


def add_evidence_many(
    session: Session,
    incident_id: int | None,
    items: Sequence[EvidenceItem],
    *,
    run_id: int | None = None,
) -> list[Evidence]:
    """Store several pieces of evidence with consecutive `E<n>` keys, numbering once (a probe
    run records hundreds of replies; numbering each one rescans the incident's keys)."""
    for item in items:
        _check_evidence(item.kind, item.summary)
    if not items:
        return []
    first = allocate_evidence_numbers(session, incident_id, len(items))
    rows = [
        Evidence(
            incident_id=incident_id,
            key=f"E{first + offset}",
            kind=item.kind,
            summary=item.summary,
            payload=item.payload or {},
            source=item.source,
            run_id=run_id,
            recorded_at=item.recorded_at or utcnow(),
        )
        for offset, item in enumerate(items)
    ]
    session.add_all(rows)
    session.flush()
    return rows


# --------------------------------------------------------------------------- captures

CONTENT_HASH = "content_sha256"
"""Payload key of a captured exchange's content hash (`exchange_content_hash`)."""
# Where an exchange came from, not what it says: the same exchange captured from another
# file, format or position is the same content.
_PROVENANCE = frozenset({"source_file", "source_format", "index", "location", "sha256"})


def exchange_content_hash(exchange: JsonObject) -> str:
    """SHA-256 of a (redacted) exchange dict without its provenance fields."""
    content = {k: v for k, v in exchange.items() if k not in _PROVENANCE}
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _scope(incident_id: int | None) -> Any:
    if incident_id is None:
        return Evidence.incident_id.is_(None)  # type: ignore[union-attr]
    return Evidence.incident_id == incident_id


def _content_hash_of(row: Evidence) -> str | None:
    digest = (row.payload or {}).get(CONTENT_HASH)
    if isinstance(digest, str):
        return digest
    exchange = (row.payload or {}).get("exchange")
    return exchange_content_hash(exchange) if isinstance(exchange, dict) else None


def last_evidence_id(session: Session) -> int:
    """The highest evidence row id (0: none); with `exchange_hashes(after_id=...)` a
    batched capture reads only the rows stored since its previous batch."""
    return int(session.exec(select(func.max(Evidence.id))).one() or 0)


def exchange_hashes(
    session: Session, incident_id: int | None, *, after_id: int = 0
) -> dict[str, str]:
    """Content hash -> evidence key of the captured exchanges of one incident (or of the
    captures attached to none), read once so a large capture checks each exchange in
    memory; rows stored before hashes were recorded are hashed here. `after_id`: only rows
    with a higher id."""
    hashed = col(Evidence.payload)[CONTENT_HASH].as_string()
    scope = (_scope(incident_id), Evidence.kind == "exchange", col(Evidence.id) > after_id)
    found: dict[str, str] = {}
    for key, digest in session.exec(
        select(Evidence.key, hashed).where(*scope, hashed.is_not(None))
    ).all():
        found.setdefault(str(digest), key)
    for row in session.exec(select(Evidence).where(*scope, hashed.is_(None))):
        legacy = _content_hash_of(row)
        if legacy is not None:
            found.setdefault(legacy, row.key)
    return found


def count_orphan_evidence(session: Session) -> int:
    """How many evidence rows are attached to no incident (one COUNT, no rows loaded)."""
    statement = select(func.count()).select_from(Evidence).where(_scope(None))
    return int(session.exec(statement).one())


def orphan_evidence(session: Session) -> list[Evidence]:
    """Evidence attached to no incident (captures stored without `--incident`), oldest
    first."""
    return list(
        session.exec(
            select(Evidence)
            .where(_scope(None))
            .order_by(col(Evidence.recorded_at), col(Evidence.id))
        ).all()
    )


def attach_evidence(
    session: Session, keys: list[str], incident_id: int
) -> list[tuple[str, str, bool]]:
    """Attach orphan evidence `keys` to an incident, renumbered in its key space, in the
    caller's transaction. Returns (orphan key, key on the incident, already there): an
    exchange whose content the incident already holds is not added twice, the orphan copy
    is removed. An unknown key raises StoreError naming it (nothing is attached)."""
    rows = {row.key: row for row in orphan_evidence(session)}
    held = exchange_hashes(session, incident_id)
    unknown = [key for key in keys if key not in rows]
    if unknown:
        raise StoreError(
            f"no evidence attached to no incident with id(s) {', '.join(unknown)} "
            "(see `triage capture --orphans`)"
        )
    results = []
    for key in dict.fromkeys(keys):
        row = rows[key]
        digest = _content_hash_of(row) if row.kind == "exchange" else None
        if digest is not None and digest in held:
            session.delete(row)
            session.flush()
            results.append((key, held[digest], True))
            continue
        new_key = next_evidence_key(session, incident_id)  # before the row moves (autoflush)
        row.incident_id = incident_id
        row.key = new_key
        session.add(row)
        session.flush()
        if digest is not None:
            held[digest] = new_key
        results.append((key, row.key, False))
    return results


def evidence_payloads(session: Session, slug: str, keys: list[str]) -> dict[str, JsonObject]:
    """Evidence key -> payload for these keys of one incident (unknown keys are left out);
    e.g. the arm measurements behind a printed diagnosis."""
    incident = get_incident(session, slug)
    if incident is None or not keys:
        return {}
    rows = session.exec(
        select(Evidence.key, Evidence.payload).where(
            Evidence.incident_id == incident.id, col(Evidence.key).in_(keys)
        )
    ).all()
    return {key: dict(payload or {}) for key, payload in rows}
