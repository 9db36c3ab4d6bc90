"""Data access for the Streamlit pages: the store handle and the read queries the pages need.

Pages never touch SQL or the ORM; they call these functions. The list queries push every
filter and the page window into SQL, so the Incidents page costs the same with ten or ten
thousand incidents. Incident detail comes from `kb.repo.files.load_record` (the same dict shape
as an incident file's front matter), so the pages and the graph work on one shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import networkx as nx
import streamlit as st
from sqlalchemy import func, or_
from sqlalchemy import select as sa_select  # typed for wide column lists
from sqlmodel import Session, col, select

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
from kb.repo import decisions as kb_decisions
from kb.repo import search as kb_search
from kb.repo.engine import database_url
from kb.repo.store import Store, get_incident
from triage.catalogue import CatalogueError
from triage.catalogue import catalogue as process_catalogue
from triage.catalogue.numbering import check_store_numbering
from triage.ui.text import md_escape

PAGE_SIZE = 50
# A search lists its best hits only (kb.repo.search builds a snippet for every hit it returns).
SEARCH_LIMIT = 200


def _close_store(store: Store) -> None:
    store.close()


@st.cache_resource(show_spinner=False, on_release=_close_store)
def _store_for(url: str) -> Store:
    store = Store(url)
    try:
        # The installed catalogue (plugins included) must agree with the numbers this
        # database recorded before any stored bit mask is read: as the CLI checks.
        check_store_numbering(store)
    except Exception:
        store.close()
        raise
    return store


def forget_stores() -> None:
    """Close and drop every cached store handle and cached state (tests; a new database)."""
    parked_state.clear()
    _store_for.clear()


def get_store() -> Store:
    """The knowledge base named by `TRIAGE_DATABASE_URL` (one engine per URL per process).
    A catalogue that cannot use this database stops the page with a clear error."""
    try:
        return _store_for(database_url())
    except CatalogueError as exc:
        st.error(md_escape(f"The installed catalogue cannot use this knowledge base: {exc}"))
        st.stop()
        raise  # st.stop() raises; this line is never reached


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
    match: str = ""  # where a search matched, with a snippet


@dataclass
class IncidentPage:
    rows: list[IncidentRow]
    total: int
    page: int
    pages: int
    searched: bool = False


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


def list_incidents(
    store: Store, filters: IncidentFilters, *, page: int = 1, page_size: int = PAGE_SIZE
) -> IncidentPage:
    """One page of incidents, newest first, with the columns the list shows."""
    with store.session(readonly=True) as session:
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
    graph: nx.Graph = nx.Graph()
    for from_cause, to_cause in links:
        if from_cause in cause_info and to_cause in cause_info:
            graph.add_edge(cause_info[from_cause][0], cause_info[to_cause][0])
    catalogues: dict[int, set[str]] = {}
    slugs: dict[int, str] = {}
    for incident_id, catalogue, slug in cause_info.values():
        catalogues.setdefault(incident_id, set()).add(catalogue)
        slugs[incident_id] = slug
    families = []
    for members in nx.connected_components(graph):
        first = min(slugs[m] for m in members)
        names = sorted(set().union(*(catalogues[m] for m in members)))
        label = f"{', '.join(names)} -- {first} (+{len(members) - 1})"
        families.append(Family(key=first, label=label, incident_ids=set(members)))
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
    from kb.repo.files import load_record
    from kb.repo.store import get_incident

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
    state: str = ""  # for the latest PARKED decision: waiting | due | overdue (kb.repo.decisions)
    reasons: list[str] = field(default_factory=list)


def describe_trigger(trigger: dict[str, Any]) -> str:
    """One line for people: what a revisit trigger waits for."""
    return str(kb_decisions.describe_trigger(trigger, process_catalogue().triggers))


@dataclass(frozen=True)
class ParkedState:
    """Whether a parked incident is due for a revisit, and why (from kb.repo.decisions)."""

    state: str  # waiting | due | overdue
    due: bool
    reasons: tuple[str, ...]


@st.cache_data(ttl=30, show_spinner="Checking parked incidents' revisit dates and triggers...")
def parked_state(url: str, on: date) -> dict[str, ParkedState]:
    """kb.repo.decisions' verdict on every parked incident as of `on`, by slug.

    Cached for 30 s: it reads every parked incident's evidence. Writes made from this UI
    clear it (`parked_changed`); writes from the CLI show up within the TTL.
    """
    with _store_for(url).session(readonly=True) as session:
        return {
            item.slug: ParkedState(item.state, item.due, tuple(item.reasons))
            for item in kb_decisions.parked(session, on, trigger_kinds=process_catalogue().triggers)
        }


def parked_changed() -> None:
    """Forget cached parked states after a decision or status change."""
    parked_state.clear()


def decision_log(store: Store, *, on: date | None = None) -> list[DecisionEntry]:
    """Every decision in time order, with due/overdue parked incidents moved to the front.

    A parked incident is overdue when its revisit date has passed or a trigger fired
    (kb.repo.decisions.parked decides, from the recorded evidence, as of `on`).
    """
    on = on or today()
    with store.session(readonly=True) as session:
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
    parked = parked_state(store.url, on)
    entries: list[DecisionEntry] = []
    latest_by_slug: dict[str, DecisionEntry] = {}
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
    ) in results:
        entry = DecisionEntry(
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
            triggers=list(triggers or []),
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
    """kb.repo.decisions' ParkedIncident for one incident (None unless it is parked)."""
    with store.session(readonly=True) as session:
        incident = get_incident(session, slug)
        if incident is None or incident.status != "parked":
            return None
        # One incident's entry, not the whole parked list.
        return kb_decisions.parked_incident(
            session, incident, on or today(), process_catalogue().triggers
        )
