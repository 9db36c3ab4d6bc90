"""Bisection records through the service: the incident a bisection reports to and one
evidence row per tested build (kb.repo.bisect), each call one transaction, so a bisection
cut short keeps every build it measured."""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from kb.repo.bisect import bisect_incident, record_bisect_step
from kb.service.core import KnowledgeBase

__all__ = ["BisectIncident", "open_bisect_incident", "record_bisect_evidence"]


@dataclass(frozen=True)
class BisectIncident:
    """The incident a bisection records on."""

    id: int
    slug: str


def open_bisect_incident(
    kb: KnowledgeBase,
    slug: str | None,
    *,
    title: str,
    model: str,
    flags: list[str],
    stack: JsonObject,
) -> BisectIncident:
    """The named incident (NotFound-style StoreError if it does not exist), or a new open
    one titled `title` with the failing server's model, flags and stack."""
    with kb.transaction() as session:
        row = bisect_incident(session, slug, title=title, model=model, flags=flags, stack=stack)
        assert row.id is not None  # flushed
        return BisectIncident(row.id, row.slug)


def record_bisect_evidence(
    kb: KnowledgeBase,
    incident: BisectIncident,
    summary: str,
    payload: JsonObject,
    *,
    kind: str = "probe",
) -> None:
    """One tested build (kind `probe`) or the bisection's result (kind `observation`)."""
    with kb.transaction() as session:
        record_bisect_step(session, incident.id, summary, payload, kind=kind)
