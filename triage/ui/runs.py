"""Engine runs of an incident for the UI: load them, and narrow a record to one run.

A record (kb.repo.files.load_record) holds the evidence of every run; the Diagnosis, Probe arms
and Cause graph tabs show one run at a time. Evidence recorded outside any run (the captured
exchange, imported files) belongs to every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kb.jsontypes import JsonObject
from kb.repo.runlog import RunInfo
from kb.service import KnowledgeBase

ALL_RUNS = 0  # the selector's "all runs" choice (run ids start at 1)


@dataclass(frozen=True)
class IncidentRuns:
    """The runs of one incident (newest first) and which run recorded each evidence key."""

    runs: list[RunInfo] = field(default_factory=list)
    evidence_run: dict[str, int] = field(default_factory=dict)

    @property
    def latest(self) -> int | None:
        return self.runs[0].id if self.runs else None

    def label(self, run_id: int) -> str:
        if run_id == ALL_RUNS:
            return f"all {len(self.runs)} runs"
        for index, run in enumerate(self.runs):
            if run.id == run_id:
                latest = " (latest)" if index == 0 else ""
                return f"run {run.id}{latest} · {run.state} · {run.started_at.replace('T', ' ')}"
        return f"run {run_id}"

    def run(self, run_id: int | None) -> RunInfo | None:
        return next((run for run in self.runs if run.id == run_id), None)


def load_runs(kb: KnowledgeBase, slug: str) -> IncidentRuns:
    found = kb.incident_runs(slug)
    return IncidentRuns(found.runs, found.evidence_run)


def record_for_run(record: JsonObject, runs: IncidentRuns, run_id: int | None) -> JsonObject:
    """A copy of the record with only the evidence of `run_id` (and evidence of no run);
    cause and finding links to other runs' evidence are dropped. None or ALL_RUNS: as is."""
    if not run_id:
        return record

    def keep(key: Any) -> bool:
        return runs.evidence_run.get(str(key), run_id) == run_id

    narrowed = dict(record)
    narrowed["evidence"] = [e for e in record.get("evidence") or [] if keep(e.get("id"))]
    narrowed["causes"] = [
        {
            **cause,
            "evidence": [link for link in cause.get("evidence") or [] if keep(link.get("id"))],
        }
        for cause in record.get("causes") or []
    ]
    narrowed["symptoms"] = [
        {**symptom, "evidence": [key for key in symptom.get("evidence") or [] if keep(key)]}
        for symptom in record.get("symptoms") or []
    ]
    return narrowed


def run_verdicts(runs: IncidentRuns, run_id: int | None) -> dict[str, str]:
    """Cause id -> the status that run's diagnosis gave it (empty without a stored result)."""
    run = runs.run(run_id)
    if run is None:
        return {}
    return {
        str(c.get("id")): str(c.get("status", ""))
        for c in run.result.get("causes") or []
        if isinstance(c, dict)
    }


def unexplained_parts(runs: IncidentRuns, run_id: int | None) -> tuple[str, str, list[str]] | None:
    """The UNEXPLAINED verdict of the run (default: the latest): (headline, what was ruled
    out, the next probes), or None when that run has another verdict (or none: older
    results)."""
    run = runs.run(run_id or runs.latest)
    verdict = run.result.get("verdict") if run is not None else None
    if not isinstance(verdict, dict) or verdict.get("status") != "unexplained":
        return None
    probes = [str(p) for p in verdict.get("next_probes") or []]
    return str(verdict.get("headline")), str(verdict.get("ruled_out") or ""), probes
