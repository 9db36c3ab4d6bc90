"""Failure families stored: signature rows, similar past incidents, family links.

What a signature holds and how similarity is computed (weighted Jaccard over finding kinds,
confirmed causes and fingerprint fields) are pure rules, described and implemented in
kb.domain.family; this module stores signatures and queries them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, TypedDict

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    cast,
    literal,
    literal_column,
    or_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Field, Session, SQLModel, col, select

from kb import vocab
from kb.domain.errors import StoreError
from kb.domain.family import (
    WEIGHTS,
    FamilyMatch,
    Signature,
    elements,
    signature,
    similarity,
)
from kb.jsontypes import JsonObject
from kb.models import Cause, FamilyLink, Incident, Symptom
from kb.repo.store import require_incident

__all__ = [
    "IncidentSignature",
    "incident_signature",
    "incident_stack",
    "link_family",
    "refresh_signatures",
    "similar_incidents",
]

# Bits of `kinds_mask` / `causes_mask`: bit = the id's stable number as recorded in the
# store (kb/vocab.py `family_bits`), never a tuple position, so stored masks mean the same
# thing after an id is added anywhere. An id without a recorded number is matched by its
# text in `kinds` / `causes`.


class IncidentSignature(SQLModel, table=True):
    """The stored signature of one incident (see the module docstring)."""

    incident_id: int = Field(
        sa_column=Column(Integer, ForeignKey("incident.id", ondelete="CASCADE"), primary_key=True)
    )
    stale: bool = Field(default=True, sa_column=Column(Boolean, nullable=False))
    kinds_mask: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    causes_mask: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    kinds: str = Field(default="", sa_column=Column(Text, nullable=False))
    causes: str = Field(default="", sa_column=Column(Text, nullable=False))
    model_family: str = Field(default="", sa_column=Column(String(50), nullable=False))
    server_build: str = Field(default="", sa_column=Column(String(50), nullable=False))
    spec: str = Field(default="", sa_column=Column(String(8), nullable=False))
    thinking: str = Field(default="", sa_column=Column(String(8), nullable=False))
    kinds_count: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    causes_count: int = Field(default=0, sa_column=Column(Integer, nullable=False))


_SIGNATURES = IncidentSignature.__table__  # type: ignore[attr-defined]


def incident_stack(incident: Incident) -> JsonObject:
    """A stored incident's `stack` map in its file's shape (kb.repo.filerecord, empty columns
    kept): its stack columns plus its free-form extras."""
    return {
        "model": incident.model,
        "weights": incident.weights,
        "server_build": incident.server_build,
        "flags": list(incident.flags or []),
        **(incident.stack or {}),
    }


# ------------------------------------------------------------------ stored signatures


def _split(text: str) -> frozenset[str]:
    return frozenset(part for part in (text or "").split(",") if part)


def _from_row(row: Any) -> Signature:
    return Signature(
        kinds=_split(row.kinds),
        causes=_split(row.causes),
        model_family=row.model_family,
        server_build=row.server_build,
        spec=row.spec,
        thinking=row.thinking,
    )


def _computed(session: Session, incident_ids: Sequence[int]) -> dict[int, Signature]:
    """Signatures of stored incidents computed from their rows (three queries)."""
    if not incident_ids:
        return {}
    ids = list(incident_ids)
    kinds: dict[int, set[str]] = {i: set() for i in ids}
    causes: dict[int, set[str]] = {i: set() for i in ids}
    for incident_id, kind in session.exec(
        select(Symptom.incident_id, Symptom.kind).where(Symptom.incident_id.in_(ids))  # type: ignore[attr-defined]
    ).all():
        if kind:
            kinds[incident_id].add(kind)
    for incident_id, catalogue_id in session.exec(
        select(Cause.incident_id, Cause.catalogue_id).where(
            Cause.incident_id.in_(ids),  # type: ignore[attr-defined]
            Cause.status == "confirmed",
        )
    ).all():
        causes[incident_id].add(catalogue_id)
    incidents = session.exec(select(Incident).where(Incident.id.in_(ids))).all()  # type: ignore[union-attr]
    return {
        incident.id: signature(kinds[incident.id], causes[incident.id], incident_stack(incident))
        for incident in incidents
        if incident.id is not None
    }


def incident_signature(session: Session, slug: str) -> Signature:
    """The signature of a stored incident, from its current rows."""
    incident = require_incident(session, slug)
    assert incident.id is not None
    return _computed(session, [incident.id])[incident.id]


class _SignatureColumns(TypedDict):
    """The columns of an incidentsignature row written for a signature."""

    stale: bool
    kinds_mask: int
    causes_mask: int
    kinds: str
    causes: str
    model_family: str
    server_build: str
    spec: str
    thinking: str
    kinds_count: int
    causes_count: int


def _row_values(sig: Signature, bits: Mapping[str, Mapping[str, int]]) -> _SignatureColumns:
    return {
        "stale": False,
        "kinds_mask": sum(bits["check"].get(kind, 0) for kind in sig.kinds),
        "causes_mask": sum(bits["cause"].get(cause, 0) for cause in sig.causes),
        # Kinds and causes are ids without commas (schema: [A-Za-z0-9._-]); drop any that
        # are not, rather than corrupt the list.
        "kinds": ",".join(sorted(k for k in sig.kinds if "," not in k)),
        "causes": ",".join(sorted(c for c in sig.causes if "," not in c)),
        "model_family": sig.model_family[:50],
        "server_build": sig.server_build[:50],
        "spec": sig.spec[:8],
        "thinking": sig.thinking[:8],
        "kinds_count": len(sig.kinds),
        "causes_count": len(sig.causes),
    }


def _pending(session: Session, incident_ids: Iterable[int] | None) -> list[int]:
    if incident_ids is not None:
        return sorted(set(incident_ids))
    return list(
        session.exec(
            select(IncidentSignature.incident_id)
            .where(IncidentSignature.stale == True)  # noqa: E712 (SQL expression)
            .order_by(_SIGNATURES.c.incident_id)
        ).all()
    )


def refresh_signatures(
    session: Session,
    incident_ids: Iterable[int] | None = None,
    *,
    batch: int = 2000,
    vocabulary: vocab.Vocabulary | None = None,
) -> int:
    """Recompute stale signatures (or those of `incident_ids`); the number written.

    `vocabulary` (the catalogue's numbers, passed in by triage) is checked against the
    recorded numbers and its new ones recorded before masks are written (VocabularyError
    if a number moved); masks carry the bits of every recorded number.
    Rows are locked before the incident's rows are read (PostgreSQL), so a writer that
    changes the incident meanwhile waits and marks the row stale again afterwards.
    """
    pending = _pending(session, incident_ids)
    written = 0
    if pending and vocabulary is not None:
        recorded = vocab.record_vocabulary(session, vocabulary)
        if incident_ids is None and any(recorded.values()):  # rows newly marked stale
            pending = _pending(session, None)
    bits = vocab.family_bits(session)
    statement = (
        update(_SIGNATURES)
        .where(_SIGNATURES.c.incident_id == bindparam("b_incident_id"))
        .values({name: bindparam(name) for name in _row_values(Signature(), bits)})
    )
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        locked = list(
            session.exec(
                select(IncidentSignature.incident_id)
                .where(_SIGNATURES.c.incident_id.in_(chunk))
                .order_by(_SIGNATURES.c.incident_id)
                # A row locked by a writer is skipped: the writer marks it stale again
                # when it commits, and a refresh never waits (so it cannot deadlock).
                .with_for_update(skip_locked=True)
            ).all()
        )
        computed = _computed(session, locked)
        rows = [{"b_incident_id": i, **_row_values(sig, bits)} for i, sig in computed.items()]
        if rows:
            session.connection().execute(statement, rows)
            written += len(rows)
    return written


# ------------------------------------------------------------------ matching


def _contains(column: Any, item: str) -> ColumnElement[bool]:
    """`item` is one of the comma-separated ids in `column` (exact, no wildcards)."""
    clause: ColumnElement[bool] = (literal(",") + column + literal(",")).contains(
        f",{item},", autoescape=True
    )
    return clause


def _bit_count(column: Any, bits: Iterable[int]) -> ColumnElement[Any]:
    """How many of the given bits are set in `column` (integer arithmetic, no CASE)."""
    terms = [
        column.op(">>")(literal_column(str(bit.bit_length() - 1))).op("&")(literal_column("1"))
        for bit in bits
    ]
    total: ColumnElement[Any] = sum(terms[1:], terms[0])
    return total


def _ranked_statement(
    query: Signature, limit: int, exclude_id: int | None, family: Mapping[str, Mapping[str, int]]
) -> Any:
    """SQL for the `limit` fresh signatures most similar to `query`, as (incident_id, score).

    The same formula as `similarity`: shared / (mine + theirs - shared), where `theirs` is
    the row's weight in the dimensions the query compares (>= shared, so the divisor is at
    least `mine` > 0). The inner query computes `shared` and `theirs` once per row; its
    OFFSET 0 keeps SQLite and PostgreSQL from inlining them twice into the outer division.
    """
    t = _SIGNATURES.c
    shared: list[ColumnElement[Any]] = []
    theirs: list[ColumnElement[Any]] = []

    def weight(name: str) -> ColumnElement[Any]:
        return literal_column(str(int(WEIGHTS[name])))

    for dimension, column, mask, bits, texts in (
        ("kind", t.kinds_count, t.kinds_mask, family["check"], query.kinds),
        ("cause", t.causes_count, t.causes_mask, family["cause"], query.compared_causes()),
    ):
        if not texts:
            continue
        known = [bits[item] for item in sorted(texts) if item in bits]
        count: list[ColumnElement[Any]] = [_bit_count(mask, known)] if known else []
        text_column = t.kinds if dimension == "kind" else t.causes
        count += [
            cast(_contains(text_column, item), Integer)
            for item in sorted(texts)
            if item not in bits
        ]
        shared.append(sum(count[1:], count[0]) * weight(dimension))
        theirs.append(column * weight(dimension))
    for name, value in query.fingerprint().items():
        if value:
            shared.append(cast(t[name] == value, Integer) * weight(name))
            theirs.append(cast(t[name] != "", Integer) * weight(name))
    inner = select(
        t.incident_id.label("incident_id"),
        sum(shared[1:], shared[0]).label("shared"),
        sum(theirs[1:], theirs[0]).label("theirs"),
    ).where(t.stale == False)  # noqa: E712 (SQL expression)
    if exclude_id is not None:
        inner = inner.where(t.incident_id != exclude_id)
    rows = inner.offset(0).subquery("candidate")
    mine: ColumnElement[Any] = literal_column(
        str(int(sum(elements(query, as_query=True).values())))
    )
    score = (cast(rows.c.shared, Float) / cast(mine + rows.c.theirs - rows.c.shared, Float)).label(
        "score"
    )
    return (
        select(rows.c.incident_id, score)
        .order_by(score.desc(), rows.c.incident_id.desc())
        .limit(limit)
    )


def _linked_incidents(session: Session, incident_id: int, others: Sequence[int]) -> set[int]:
    """Which of `others` share a FamilyLink (either direction) with `incident_id`."""
    if not others:
        return set()
    from_cause = Cause.__table__.alias("from_cause")  # type: ignore[attr-defined]
    to_cause = Cause.__table__.alias("to_cause")  # type: ignore[attr-defined]
    links = FamilyLink.__table__  # type: ignore[attr-defined]
    statement = (
        select(from_cause.c.incident_id, to_cause.c.incident_id)
        .select_from(links)
        .join(from_cause, from_cause.c.id == links.c.from_cause_id)
        .join(to_cause, to_cause.c.id == links.c.to_cause_id)
        .where(
            or_(
                and_(
                    from_cause.c.incident_id == incident_id,
                    to_cause.c.incident_id.in_(list(others)),
                ),
                and_(
                    to_cause.c.incident_id == incident_id,
                    from_cause.c.incident_id.in_(list(others)),
                ),
            )
        )
    )
    linked: set[int] = set()
    for a, b in session.connection().execute(statement):
        linked.add(b if a == incident_id else a)
    return linked


def similar_incidents(
    session: Session,
    query: Signature,
    limit: int = 10,
    *,
    exclude_slug: Optional[str] = None,
    min_score: float = 0.1,
) -> list[FamilyMatch]:
    """Past incidents most similar to `query`, best first (score >= `min_score`).

    `exclude_slug` leaves out the incident the query came from and reports which matches
    are already linked to it as the same family.
    """
    limit = max(1, int(limit))
    if not elements(query, as_query=True):
        return []
    exclude_id: int | None = None
    if exclude_slug is not None:
        exclude_id = require_incident(session, exclude_slug).id
    scored: dict[int, tuple[float, Signature | None]] = {
        int(row.incident_id): (float(row.score), None)
        for row in session.connection().execute(
            _ranked_statement(query, limit, exclude_id, vocab.family_bits(session))
        )
    }

    # Stale rows: scored from the incident's rows, with the Python formula.
    stale_ids = [
        i
        for i in session.exec(
            select(IncidentSignature.incident_id).where(
                IncidentSignature.stale == True  # noqa: E712 (SQL expression)
            )
        ).all()
        if i != exclude_id
    ]
    for incident_id, sig in _computed(session, stale_ids).items():
        scored[incident_id] = (similarity(query, sig), sig)

    ranked = sorted(scored.items(), key=lambda item: (-item[1][0], -item[0]))
    ranked = [item for item in ranked if item[1][0] >= min_score][:limit]
    if not ranked:
        return []
    ids = [incident_id for incident_id, _ in ranked]
    fresh = [incident_id for incident_id, (_score, sig) in ranked if sig is None]
    if fresh:
        rows = session.exec(
            select(IncidentSignature).where(IncidentSignature.incident_id.in_(fresh))  # type: ignore[attr-defined]
        ).all()
        loaded = {row.incident_id: _from_row(row) for row in rows}
        ranked = [
            (i, (score, sig or loaded[i])) for i, (score, sig) in ranked if sig or i in loaded
        ]
    incidents = {
        row[0]: row
        for row in session.exec(
            select(Incident.id, Incident.slug, Incident.title, Incident.status).where(
                Incident.id.in_(ids)  # type: ignore[union-attr]
            )
        ).all()
    }
    linked = _linked_incidents(session, exclude_id, ids) if exclude_id is not None else set()
    return [
        _match(query, score, sig, incidents[incident_id], incident_id in linked)
        for incident_id, (score, sig) in ranked
        if incident_id in incidents and sig is not None
    ]


def _match(query: Signature, score: float, sig: Signature, row: Any, linked: bool) -> FamilyMatch:
    """One past incident's match with what it shares with the query."""
    _id, slug, title, status = row
    query_stack = query.fingerprint()
    return FamilyMatch(
        slug=slug,
        title=title,
        status=status,
        score=round(score, 4),
        shared_kinds=sorted(query.kinds & sig.kinds),
        shared_causes=sorted(query.compared_causes() & sig.causes),
        shared_stack=[
            f"{name}={value}"
            for name, value in sig.fingerprint().items()
            if value and query_stack[name] == value
        ],
        confirmed_causes=sorted(sig.causes),
        model_family=sig.model_family,
        linked=linked,
    )


# ------------------------------------------------------------------ family links


def _cause(session: Session, incident: Incident, cause: str) -> Cause:
    """A cause of `incident` by key, else by catalogue id if exactly one cause has it."""
    rows = session.exec(
        select(Cause).where(
            Cause.incident_id == incident.id,
            or_(Cause.key == cause, Cause.catalogue_id == cause),  # type: ignore[arg-type]
        )
    ).all()
    by_key = [row for row in rows if row.key == cause]
    if by_key:
        return by_key[0]
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise StoreError(f"incident {incident.slug!r} has no cause {cause!r}")
    keys = sorted(row.key for row in rows)
    raise StoreError(f"incident {incident.slug!r}: {cause!r} is ambiguous (causes {keys})")


def link_family(
    session: Session,
    from_slug: str,
    from_cause: str,
    to_slug: str,
    to_cause: str,
    note: str = "",
) -> FamilyLink:
    """Record that a cause of one incident is the same failure family as a cause of another.

    Causes are named by key or catalogue id. Links are undirected: if the pair is already
    linked either way, that link is returned (its note replaced when `note` is given).
    """
    source = require_incident(session, from_slug)
    target = require_incident(session, to_slug)
    if source.id == target.id:
        raise StoreError("a family link joins causes of two different incidents")
    a = _cause(session, source, from_cause)
    b = _cause(session, target, to_cause)
    assert a.id is not None and b.id is not None
    existing = session.exec(
        select(FamilyLink).where(
            or_(
                and_(col(FamilyLink.from_cause_id) == a.id, col(FamilyLink.to_cause_id) == b.id),
                and_(col(FamilyLink.from_cause_id) == b.id, col(FamilyLink.to_cause_id) == a.id),
            )
        )
    ).first()
    if existing is not None:
        if note and existing.note != note:
            existing.note = note
            session.add(existing)
            session.flush()
        return existing
    link = FamilyLink(from_cause_id=a.id, to_cause_id=b.id, note=note)
    session.add(link)
    session.flush()
    return link
