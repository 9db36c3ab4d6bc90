"""Incident queries of the service: the filtered, paged list, families, decisions.

Every filter and the page window are pushed into SQL, so the list costs the same with ten or
ten thousand incidents.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
from sqlalchemy import func, or_
from sqlalchemy import select as sa_select  # typed for wide column lists
from sqlmodel import Session, col, select

from kb.domain.triggers import stored_trigger
from kb.models import Cause, Decision, FamilyLink, Incident, Symptom
from kb.repo import search as kb_search
from kb.service.records import (
    DecisionRow,
    Family,
    IncidentFilters,
    IncidentPage,
    IncidentRow,
    IncidentTitle,
)

# A search lists its best hits only (kb.repo.search builds a snippet for every hit it returns).
SEARCH_LIMIT = 200


def _latest_decision_kind() -> Any:
    # Correlated scalar subquery: one indexed lookup per incident row, works on SQLite and
    # PostgreSQL alike, and lets the decision filter run inside the same SELECT.
    return (
        select(Decision.kind)
        .where(Decision.incident_id == Incident.id)
        .order_by(col(Decision.decided_at).desc(), col(Decision.id).desc())
        .limit(1)
        .scalar_subquery()
    )


def _search(session: Session, query: str) -> dict[int, str]:
    """Incident id -> matching snippet for a free-text query, best first (kb.repo.search)."""
    hits = kb_search.search(session, query, limit=SEARCH_LIMIT)
    slugs = [hit.slug for hit in hits]
    found = dict(
        session.exec(
            select(Incident.slug, Incident.id).where(col(Incident.slug).in_(slugs or [""]))
        ).all()
    )
    return {
        int(found[hit.slug] or 0): f"{hit.field}: {hit.snippet}"
        for hit in hits
        if hit.slug in found
    }


def _conditions(
    session: Session, filters: IncidentFilters
) -> tuple[list[Any], dict[int, str] | None]:
    conditions: list[Any] = []
    matches: dict[int, str] | None = None
    if filters.query.strip():
        matches = _search(session, filters.query)
        conditions.append(col(Incident.id).in_(list(matches) or [-1]))
    if filters.statuses:
        conditions.append(col(Incident.status).in_(filters.statuses))
    if filters.cause or filters.cause_status:
        cause_match = select(Cause.incident_id)
        if filters.cause:
            cause_match = cause_match.where(
                or_(col(Cause.catalogue_id) == filters.cause, col(Cause.key) == filters.cause)
            )
        if filters.cause_status:
            cause_match = cause_match.where(Cause.status == filters.cause_status)
        conditions.append(col(Incident.id).in_(cause_match))
    latest = _latest_decision_kind()
    if filters.decision == "none":
        conditions.append(latest.is_(None))
    elif filters.decision:
        conditions.append(latest == filters.decision)
    if filters.family:
        members = family_members(session, filters.family)
        conditions.append(col(Incident.id).in_(sorted(members) or [-1]))
    return conditions, matches


def list_incidents(
    session: Session, filters: IncidentFilters, *, page: int, page_size: int
) -> IncidentPage:
    """One page of incidents, newest first (search hits: best first)."""
    conditions, matches = _conditions(session, filters)
    total = session.exec(select(func.count()).select_from(Incident).where(*conditions)).one()
    pages = max(1, -(-int(total) // page_size))
    page = min(max(1, page), pages)
    statement = sa_select(
        col(Incident.id),
        col(Incident.slug),
        col(Incident.title),
        col(Incident.status),
        col(Incident.opened_on),
    ).where(*conditions)
    if matches is not None:
        # Keep the search ranking: order in Python over at most SEARCH_LIMIT hits.
        rows_all = {r[0]: r for r in session.execute(statement).all()}
        ordered = [rows_all[i] for i in matches if i in rows_all]
        window = ordered[(page - 1) * page_size : page * page_size]
    else:
        statement = statement.order_by(col(Incident.opened_on).desc(), col(Incident.id).desc())
        window = list(
            session.execute(statement.offset((page - 1) * page_size).limit(page_size)).all()
        )
    rows = _rows_with_details(session, window)
    for row, (incident_id, *_rest) in zip(rows, window, strict=True):
        row.match = (matches or {}).get(incident_id, "")
    return IncidentPage(
        rows=rows, total=int(total), page=page, pages=pages, searched=matches is not None
    )


def _rows_with_details(session: Session, window: list[Any]) -> list[IncidentRow]:
    ids = [r[0] for r in window]
    rows = {r[0]: IncidentRow(slug=r[1], title=r[2], status=r[3], opened=r[4]) for r in window}
    if not ids:
        return []
    for incident_id, kind, key in session.exec(
        select(Symptom.incident_id, Symptom.kind, Symptom.key)
        .where(col(Symptom.incident_id).in_(ids))
        .order_by(col(Symptom.id))
    ).all():
        rows[incident_id].findings.append(kind or key)
    for incident_id, key in session.exec(
        select(Cause.incident_id, Cause.key)
        .where(col(Cause.incident_id).in_(ids), Cause.status == "confirmed")
        .order_by(col(Cause.id))
    ).all():
        rows[incident_id].confirmed_causes.append(key)
    for decision in session.exec(
        select(Decision)
        .where(col(Decision.incident_id).in_(ids))
        .order_by(col(Decision.decided_at), col(Decision.id))
    ).all():
        row = rows[decision.incident_id]  # later decisions overwrite earlier ones
        row.decision = decision.kind
        row.decision_at = decision.decided_at
        row.revisit_on = decision.revisit_on
    return [rows[i] for i in ids]


def families(session: Session) -> list[Family]:
    """Connected groups of incidents joined by same-family cause links."""
    links = session.exec(select(FamilyLink.from_cause_id, FamilyLink.to_cause_id)).all()
    if not links:
        return []
    cause_ids = {c for link in links for c in link}
    cause_info = {
        row[0]: (row[1], row[2], row[3])
        for row in session.exec(
            select(Cause.id, Cause.incident_id, Cause.catalogue_id, Incident.slug)
            .join(Incident, col(Incident.id) == Cause.incident_id)
            .where(col(Cause.id).in_(cause_ids))
        ).all()
    }
    graph: nx.Graph = nx.Graph()
    for from_cause, to_cause in links:
        if from_cause in cause_info and to_cause in cause_info:
            graph.add_edge(cause_info[from_cause][0], cause_info[to_cause][0])
    catalogues: dict[int, set[str]] = {}
    slugs: dict[int, str] = {}
    for incident_id, catalogue, slug in cause_info.values():
        catalogues.setdefault(incident_id, set()).add(catalogue)
        slugs[incident_id] = slug
    found = []
    for members in nx.connected_components(graph):
        first = min(slugs[m] for m in members)
        names = sorted(set().union(*(catalogues[m] for m in members)))
        label = f"{', '.join(names)} -- {first} (+{len(members) - 1})"
        found.append(Family(key=first, label=label, incident_ids=set(members)))
    return sorted(found, key=lambda f: f.key)


def family_members(session: Session, key: str) -> set[int]:
    for family in families(session):
        if family.key == key:
            return family.incident_ids
    return set()


def recent_incidents(session: Session, limit: int) -> list[IncidentTitle]:
    """The most recently opened incidents, newest first."""
    rows = session.exec(
        select(Incident.slug, Incident.title)
        .order_by(col(Incident.opened_on).desc(), col(Incident.id).desc())
        .limit(limit)
    ).all()
    return [IncidentTitle(slug=r[0], title=r[1]) for r in rows]


def decisions(session: Session) -> list[DecisionRow]:
    """Every decision in time order, with its incident's slug, title and status."""
    results = session.execute(
        sa_select(
            col(Incident.slug),
            col(Incident.title),
            col(Incident.status),
            col(Decision.kind),
            col(Decision.decided_at),
            col(Decision.decided_by),
            col(Decision.rationale),
            col(Decision.tradeoff),
            col(Decision.fix),
            col(Decision.verified),
            col(Decision.revisit_on),
            col(Decision.revisit_triggers),
        )
        .join(Incident, col(Incident.id) == Decision.incident_id)
        .order_by(col(Decision.decided_at), col(Decision.id))
    ).all()
    return [
        DecisionRow(
            slug=slug,
            title=title,
            incident_status=status,
            kind=kind,
            at=at,
            by=by,
            rationale=rationale,
            tradeoff=tradeoff,
            fix=fix,
            verified=verified,
            revisit_on=revisit_on,
            triggers=tuple(stored_trigger(t) for t in triggers or ()),
        )
        for (
            slug,
            title,
            status,
            kind,
            at,
            by,
            rationale,
            tradeoff,
            fix,
            verified,
            revisit_on,
            triggers,
        ) in results
    ]


def find_cause(session: Session, incident_id: int | None, key: str) -> Cause | None:
    """An incident's cause by its key."""
    return session.exec(
        select(Cause).where(Cause.incident_id == incident_id, col(Cause.key) == key)
    ).first()
