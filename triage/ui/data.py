"""Data access for the Streamlit pages: the store handle and the read queries the pages need.

Pages never touch SQL or the ORM; they call these functions. The list queries push every
filter and the page window into SQL, so the Incidents page costs the same with ten or ten
thousand incidents. Incident detail comes from `kb.files.load_record` (the same dict shape
as an incident file's front matter), so the pages and the graph work on one shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import streamlit as st
from sqlalchemy import func, or_
from sqlmodel import Session, col, select

from kb import decisions as kb_decisions
from kb.models import (
    CAUSE_CATALOGUE_IDS,
    CAUSE_STATUSES,
    DECISION_KINDS,
    INCIDENT_STATUSES,
    Cause,
    Decision,
    FamilyLink,
    Incident,
    Symptom,
)
from kb.store import Store, database_url

PAGE_SIZE = 50


def _close_store(store: Store) -> None:
    store.close()


@st.cache_resource(show_spinner=False, on_release=_close_store)
def _store_for(url: str) -> Store:
    return Store(url)


def forget_stores() -> None:
    """Close and drop every cached store handle (tests; a changed database URL)."""
    _store_for.clear()


def get_store() -> Store:
    """The knowledge base named by `TRIAGE_DATABASE_URL` (one engine per URL per process)."""
    return _store_for(database_url())


def today() -> date:
    """Today's date; `TRIAGE_TODAY=YYYY-MM-DD` pins it (tests, reviewing a past state)."""
    pinned = os.environ.get("TRIAGE_TODAY", "").strip()
    if pinned:
        return date.fromisoformat(pinned)
    return date.today()


# --------------------------------------------------------------------------- incidents list


@dataclass(frozen=True)
class IncidentFilters:
    """What the Incidents page filters on; every field maps to a SQL condition."""

    query: str = ""
    statuses: tuple[str, ...] = ()
    cause: str = ""
    cause_status: str = ""
    decision: str = ""  # latest decision kind, or "none"
    family: str = ""  # a family key from `families()`


@dataclass
class IncidentRow:
    slug: str
    title: str
    status: str
    opened: date
    findings: list[str] = field(default_factory=list)
    confirmed_causes: list[str] = field(default_factory=list)
    decision: str = ""
    decision_at: datetime | None = None
    revisit_on: date | None = None


@dataclass
class IncidentPage:
    rows: list[IncidentRow]
    total: int
    page: int
    pages: int
    search_backend: str


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


def _search_ids(session: Session, query: str) -> tuple[list[int] | None, str]:
    """Incident ids matching a free-text query, best first, via kb.search when present."""
    try:
        from kb import search as kb_search  # landed by the search work (issue 8)
    except ImportError:
        return None, "title"
    hits = kb_search.search(session, query, limit=1000)
    ids: list[int] = []
    slugs: list[str] = []
    for hit in hits:
        value = hit if isinstance(hit, dict) else getattr(hit, "__dict__", {})
        if value.get("incident_id") is not None:
            ids.append(int(value["incident_id"]))
        elif value.get("slug"):
            slugs.append(str(value["slug"]))
    if slugs:
        found = dict(
            session.exec(
                select(Incident.slug, Incident.id).where(col(Incident.slug).in_(slugs))
            ).all()
        )
        ids.extend(found[s] for s in slugs if s in found)
    return list(dict.fromkeys(ids)), "full-text"


def list_incidents(
    store: Store, filters: IncidentFilters, *, page: int = 1, page_size: int = PAGE_SIZE
) -> IncidentPage:
    """One page of incidents, newest first, with the columns the list shows."""
    with store.session(readonly=True) as session:
        conditions: list[Any] = []
        backend = "none"
        ranked: list[int] | None = None
        text = filters.query.strip()
        if text:
            ranked, backend = _search_ids(session, text)
            if ranked is None:
                pattern = f"%{text}%"
                conditions.append(
                    or_(col(Incident.title).ilike(pattern), col(Incident.slug).ilike(pattern))
                )
            else:
                conditions.append(col(Incident.id).in_(ranked or [-1]))
        if filters.statuses:
            conditions.append(col(Incident.status).in_(filters.statuses))
        if filters.cause or filters.cause_status:
            cause_match = select(Cause.incident_id)
            if filters.cause:
                cause_match = cause_match.where(
                    or_(Cause.catalogue_id == filters.cause, Cause.key == filters.cause)
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

        total = session.exec(
            select(func.count()).select_from(Incident).where(*conditions)
        ).one()
        pages = max(1, -(-int(total) // page_size))
        page = min(max(1, page), pages)
        statement = select(Incident.id, Incident.slug, Incident.title, Incident.status,
                           Incident.opened_on).where(*conditions)
        if ranked:
            # Keep the search ranking: order in Python over at most `limit` hits.
            rows_all = {r[0]: r for r in session.exec(statement).all()}
            ordered = [rows_all[i] for i in ranked if i in rows_all]
            window = ordered[(page - 1) * page_size : page * page_size]
        else:
            statement = statement.order_by(
                col(Incident.opened_on).desc(), col(Incident.id).desc()
            )
            window = list(
                session.exec(statement.offset((page - 1) * page_size).limit(page_size)).all()
            )
        rows = _rows_with_details(session, window)
    return IncidentPage(rows=rows, total=int(total), page=page, pages=pages,
                        search_backend=backend)


def _rows_with_details(session: Session, window: list[Any]) -> list[IncidentRow]:
    ids = [r[0] for r in window]
    rows = {
        r[0]: IncidentRow(slug=r[1], title=r[2], status=r[3], opened=r[4]) for r in window
    }
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


# --------------------------------------------------------------------------- families


@dataclass
class Family:
    key: str
    label: str
    incident_ids: set[int]


def _family_components(session: Session) -> list[Family]:
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
    parent: dict[int, int] = {}

    def find(node: int) -> int:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b in links:
        if a in cause_info and b in cause_info:
            parent[find(cause_info[a][0])] = find(cause_info[b][0])
    groups: dict[int, set[int]] = {}
    catalogues: dict[int, set[str]] = {}
    slugs: dict[int, str] = {}
    for incident_id, catalogue, slug in cause_info.values():
        root = find(incident_id)
        groups.setdefault(root, set()).add(incident_id)
        catalogues.setdefault(root, set()).add(catalogue)
        slugs[incident_id] = slug
    families = []
    for root, members in groups.items():
        first = min(slugs[m] for m in members)
        label = f"{', '.join(sorted(catalogues[root]))} -- {first} (+{len(members) - 1})"
        families.append(Family(key=first, label=label, incident_ids=members))
    return sorted(families, key=lambda f: f.key)


def families(store: Store) -> list[Family]:
    """Every failure family (incidents linked by same-family causes), keyed by its first slug."""
    with store.session(readonly=True) as session:
        return _family_components(session)


def family_members(session: Session, key: str) -> set[int]:
    for family in _family_components(session):
        if family.key == key:
            return family.incident_ids
    return set()


def filter_choices() -> dict[str, tuple[str, ...]]:
    """The fixed vocabularies the filters offer."""
    return {
        "statuses": INCIDENT_STATUSES,
        "causes": CAUSE_CATALOGUE_IDS,
        "cause_statuses": CAUSE_STATUSES,
        "decisions": DECISION_KINDS,
    }


# --------------------------------------------------------------------------- one incident


def load_incident(store: Store, slug: str) -> dict[str, Any] | None:
    """The incident record (front-matter shape) or None when there is no such slug."""
    from kb.files import load_record
    from kb.store import get_incident

    with store.session(readonly=True) as session:
        if get_incident(session, slug) is None:
            return None
        return load_record(session, slug)


def recent_incidents(store: Store, limit: int = 100) -> list[tuple[str, str]]:
    """(slug, title) of the most recently opened incidents, for the incident picker."""
    with store.session(readonly=True) as session:
        rows = session.exec(
            select(Incident.slug, Incident.title)
            .order_by(col(Incident.opened_on).desc(), col(Incident.id).desc())
            .limit(limit)
        ).all()
    return [(r[0], r[1]) for r in rows]


# --------------------------------------------------------------------------- decision log


@dataclass
class DecisionEntry:
    slug: str
    title: str
    incident_status: str
    kind: str
    at: datetime
    by: str
    rationale: str
    tradeoff: str
    fix: str
    verified: bool
    revisit_on: date | None
    triggers: list[dict[str, Any]]
    latest: bool = False
    overdue: bool = False
    state: str = ""  # for the latest PARKED decision: waiting | due | overdue (kb.decisions)
    reasons: list[str] = field(default_factory=list)


def describe_trigger(trigger: dict[str, Any]) -> str:
    """One line for people: what a revisit trigger waits for."""
    return str(kb_decisions.describe_trigger(trigger))


def parked_state(session: Session, on: date) -> dict[str, Any]:
    """kb.decisions' view of every parked incident as of `on`, by slug."""
    return {item.slug: item for item in kb_decisions.parked(session, on)}


def decision_log(store: Store, *, on: date | None = None) -> list[DecisionEntry]:
    """Every decision in time order, with due/overdue parked incidents moved to the front.

    A parked incident is overdue when its revisit date has passed or a trigger fired
    (kb.decisions.parked decides, from the recorded evidence, as of `on`).
    """
    on = on or today()
    with store.session(readonly=True) as session:
        results = session.exec(
            select(Decision, Incident.slug, Incident.title, Incident.status)
            .join(Incident, col(Incident.id) == Decision.incident_id)
            .order_by(col(Decision.decided_at), col(Decision.id))
        ).all()
        parked = parked_state(session, on)
    entries: list[DecisionEntry] = []
    latest_by_slug: dict[str, DecisionEntry] = {}
    for decision, slug, title, status in results:
        entry = DecisionEntry(
            slug=slug,
            title=title,
            incident_status=status,
            kind=decision.kind,
            at=decision.decided_at,
            by=decision.decided_by,
            rationale=decision.rationale,
            tradeoff=decision.tradeoff,
            fix=decision.fix,
            verified=decision.verified,
            revisit_on=decision.revisit_on,
            triggers=list(decision.revisit_triggers or []),
        )
        entries.append(entry)
        latest_by_slug[slug] = entry
    for slug, entry in latest_by_slug.items():
        entry.latest = True
        item = parked.get(slug)
        if entry.kind == "PARKED" and item is not None:
            entry.state = item.state
            entry.reasons = list(item.reasons)
            entry.overdue = item.due
    # Stable sort: overdue first, each group keeps time order.
    return sorted(entries, key=lambda e: not e.overdue)


def incident_parked_state(store: Store, slug: str, on: date | None = None) -> Any | None:
    """kb.decisions' ParkedIncident for one incident (None unless it is parked)."""
    with store.session(readonly=True) as session:
        return parked_state(session, on or today()).get(slug)
