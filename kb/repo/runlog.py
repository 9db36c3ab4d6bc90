"""Which engine run recorded what: the runs of an incident and the run of each evidence item.

Read-only helpers for views that show one run at a time (the UI's run selector). Incident
files carry no run ids, so imported incidents simply have no runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from kb.jsontypes import JsonObject
from kb.models import Evidence, TriageRun
from kb.repo.store import get_incident

MAX_RUNS = 200  # an incident with more runs shows the newest ones


@dataclass(frozen=True)
class RunInfo:
    """One engine run: id, state, when it started/finished, and its diagnosis result."""

    id: int
    state: str
    started_at: str
    finished_at: str
    result: JsonObject  # the diagnosis JSON as stored with the run


def incident_runs(session: Session, slug: str, limit: int = MAX_RUNS) -> list[RunInfo]:
    """The incident's engine runs, newest first (empty for an unknown slug)."""
    incident = get_incident(session, slug)
    if incident is None:
        return []
    rows = session.exec(
        select(TriageRun)
        .where(TriageRun.incident_id == incident.id)
        .order_by(col(TriageRun.id).desc())
        .limit(limit)
    ).all()
    return [
        RunInfo(
            id=int(run.id or 0),
            state=run.state,
            started_at=run.started_at.isoformat(timespec="seconds") if run.started_at else "",
            finished_at=run.finished_at.isoformat(timespec="seconds") if run.finished_at else "",
            result=dict(run.result or {}),
        )
        for run in rows
    ]


def evidence_runs(session: Session, slug: str) -> dict[str, int]:
    """Evidence key -> id of the run that recorded it (evidence from no run is left out)."""
    incident = get_incident(session, slug)
    if incident is None:
        return {}
    rows = session.exec(
        select(Evidence.key, Evidence.run_id).where(
            Evidence.incident_id == incident.id, col(Evidence.run_id).is_not(None)
        )
    ).all()
    return {str(key): int(run_id) for key, run_id in rows if run_id is not None}
