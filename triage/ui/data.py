"""Data access for the Streamlit pages: the knowledge-base handle and the reads they need.

Pages never touch SQL or the ORM; they call these functions, which call the knowledge-base
service (`kb.service.KnowledgeBase`). Incident detail is the incident file's front matter
(`KnowledgeBase.incident_record`), so the pages and the graph work on one shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date

import streamlit as st

from kb.domain.decisions import ParkedIncident
from kb.domain.triggers import Trigger
from kb.jsontypes import JsonObject
from kb.models import (
    CAUSE_STATUSES,
    DECISION_KINDS,
    INCIDENT_STATUSES,
)
from kb.repo import decisions as kb_decisions
from kb.repo.engine import database_url
from kb.service import (
    PAGE_SIZE,
    SEARCH_LIMIT,
    DecisionRow,
    Family,
    IncidentFilters,
    IncidentPage,
    IncidentRow,
    IncidentTitle,
    KnowledgeBase,
)
from triage.catalogue import CatalogueError
from triage.catalogue import catalogue as process_catalogue
from triage.catalogue.numbering import check_store_numbering
from triage.ui.text import md_escape

__all__ = [
    "PAGE_SIZE",
    "SEARCH_LIMIT",
    "Family",
    "IncidentFilters",
    "IncidentPage",
    "IncidentRow",
    "IncidentTitle",
]


def _close_store(kb: KnowledgeBase) -> None:
    kb.close()


@st.cache_resource(show_spinner=False, on_release=_close_store)
def _store_for(url: str) -> KnowledgeBase:
    kb = KnowledgeBase.open(url)
    try:
        # The installed catalogue (plugins included) must agree with the numbers this
        # database recorded before any stored bit mask is read: as the CLI checks.
        with kb.errors():
            check_store_numbering(kb.store, process_catalogue())
    except Exception:
        kb.close()
        raise
    return kb


def forget_stores() -> None:
    """Close and drop every cached store handle and cached state (tests; a new database)."""
    parked_state.clear()
    _store_for.clear()


def get_store() -> KnowledgeBase:
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


def list_incidents(
    kb: KnowledgeBase, filters: IncidentFilters, *, page: int = 1, page_size: int = PAGE_SIZE
) -> IncidentPage:
    """One page of incidents, newest first, with the columns the list shows."""
    return kb.list_incidents(filters, page=page, page_size=page_size)


def families(kb: KnowledgeBase) -> list[Family]:
    """Every failure family (incidents linked by same-family causes), keyed by its first slug."""
    return kb.families()


@dataclass(frozen=True)
class FilterChoices:
    """The vocabularies the incident list's filters offer."""

    statuses: tuple[str, ...]
    causes: tuple[str, ...]
    cause_statuses: tuple[str, ...]
    decisions: tuple[str, ...]


def filter_choices(causes: tuple[str, ...]) -> FilterChoices:
    """The vocabularies the filters offer; `causes` is the catalogue's full list."""
    return FilterChoices(
        statuses=INCIDENT_STATUSES,
        causes=causes,
        cause_statuses=CAUSE_STATUSES,
        decisions=DECISION_KINDS,
    )


# --------------------------------------------------------------------------- one incident


def load_incident(kb: KnowledgeBase, slug: str) -> JsonObject | None:
    """The incident record (its file's front-matter shape) or None when there is no such slug."""
    return kb.incident_record(slug)


def recent_incidents(kb: KnowledgeBase, limit: int = 100) -> list[tuple[str, str]]:
    """(slug, title) of the most recently opened incidents, for the incident picker."""
    return [(item.slug, item.title) for item in kb.recent_incidents(limit)]


# --------------------------------------------------------------------------- decision log


@dataclass
class DecisionEntry:
    """A decision as the decision log shows it: the recorded row and what the page adds."""

    row: DecisionRow
    latest: bool = False  # the incident's latest decision (else superseded)
    overdue: bool = False
    state: str = ""  # for the latest PARKED decision: waiting | due | overdue (kb.repo.decisions)
    reasons: list[str] = field(default_factory=list)


def describe_trigger(trigger: Trigger) -> str:
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
    return {
        item.slug: ParkedState(item.state, item.due, tuple(item.reasons))
        for item in _store_for(url).parked(on, process_catalogue().triggers)
    }


def parked_changed() -> None:
    """Forget cached parked states after a decision or status change."""
    parked_state.clear()


def decision_log(kb: KnowledgeBase, *, on: date | None = None) -> list[DecisionEntry]:
    """Every decision in time order, with due/overdue parked incidents moved to the front.

    A parked incident is overdue when its revisit date has passed or a trigger fired
    (kb.repo.decisions.parked decides, from the recorded evidence, as of `on`).
    """
    on = on or today()
    rows = kb.decisions()
    parked = parked_state(kb.url, on)
    entries: list[DecisionEntry] = []
    latest_by_slug: dict[str, DecisionEntry] = {}
    for row in rows:
        entry = DecisionEntry(row)
        entries.append(entry)
        latest_by_slug[row.slug] = entry
    for slug, entry in latest_by_slug.items():
        entry.latest = True
        item = parked.get(slug)
        if entry.row.kind == "PARKED" and item is not None:
            entry.state = item.state
            entry.reasons = list(item.reasons)
            entry.overdue = item.due
    # Stable sort: overdue first, each group keeps time order.
    return sorted(entries, key=lambda e: not e.overdue)


def incident_parked_state(
    kb: KnowledgeBase, slug: str, on: date | None = None
) -> ParkedIncident | None:
    """kb.repo.decisions' ParkedIncident for one incident (None unless it is parked)."""
    return kb.parked_incident(slug, on or today(), process_catalogue().triggers)
