"""Bisection records: the incident a bisection reports to, and one evidence row per tested
build (kb knows nothing about builds or servers: it stores what `triage bisect` measured)."""

from __future__ import annotations

from sqlmodel import Session

from kb.domain.slugs import unique_incident_slug
from kb.jsontypes import JsonObject
from kb.models import Evidence, Incident, utcnow
from kb.repo.store import add_evidence, get_incident, require_incident

SOURCE = "triage bisect"


def bisect_incident(
    session: Session,
    slug: str | None,
    *,
    title: str,
    model: str,
    flags: list[str],
    stack: JsonObject,
) -> Incident:
    """The named incident (must exist), or a new open one titled `title`."""
    if slug:
        return require_incident(session, slug)
    today = utcnow().date()
    slug = unique_incident_slug(
        today, title, exists=lambda candidate: get_incident(session, candidate) is not None
    )
    incident = Incident(
        slug=slug,
        title=title,
        opened_on=today,
        status="open",
        model=model[:300],
        summary="Opened by `triage bisect`: which llama.cpp build first fails.",
        flags=list(flags),
        stack=stack,
    )
    session.add(incident)
    session.flush()
    return incident


def record_bisect_step(
    session: Session,
    incident_id: int,
    summary: str,
    payload: JsonObject,
    *,
    kind: str = "probe",
) -> Evidence:
    """One tested build (kind `probe`) or the bisection's result (kind `observation`)."""
    return add_evidence(
        session, incident_id=incident_id, kind=kind, summary=summary, payload=payload, source=SOURCE
    )
