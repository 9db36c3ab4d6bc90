"""Step 4 of a diagnosis: one transaction writes the decided run -- the arm summaries and
observations as evidence, the verdicts applied to the incident's causes, the diagnosis
built from what was written, the run finished with it. A run is either fully recorded or
not at all. Writes go through kb functions (kb/runs.py, kb/store.py); no SQL here."""

from __future__ import annotations

from collections.abc import Sequence

from kb.domain.diagnosis import (
    Diagnosis,
    DiagnosisCause,
    Finding,
    Observation,
    SkippedArm,
    validate_diagnosis,
)
from kb.jsontypes import JsonObject
from kb.repo import runs
from kb.repo.files import load_record
from kb.repo.store import add_evidence
from triage import graph as graph_mod
from triage.engine.decide import Decision
from triage.engine.diagnosis import build_diagnosis
from triage.engine.recorder import Recorder
from triage.observe import observation_summary

__all__ = ["record"]

SOURCE = "triage diagnose"


def record(
    recorder: Recorder,
    decision: Decision,
    findings: Sequence[Finding],
    skipped: Sequence[SkippedArm],
) -> Diagnosis:
    """Write the decision and return its Diagnosis (its JSON checked against the schema
    once, here, before it is stored)."""
    assert recorder.run_id is not None
    keys = recorder.evidence_keys
    with recorder.store.session() as session:
        for arm in decision.summaries:
            keys[arm.arm] = add_evidence(
                session,
                incident_id=recorder.incident_id,
                kind="measurement",
                summary=arm.evidence_summary(),
                payload=arm.to_dict(),
                source=SOURCE,
                run_id=recorder.run_id,
            ).key
        for name, facts in decision.facts.items():
            keys[name] = add_evidence(
                session,
                incident_id=recorder.incident_id,
                kind="observation",
                summary=observation_summary(name, facts),
                payload={"type": "observation", **facts},
                source=SOURCE,
                run_id=recorder.run_id,
            ).key
        changes = {}
        if decision.rows is not None:
            rows = [_with_keys(recorder, row) for row in decision.rows]
            changes = runs.apply_verdicts(
                session, recorder.incident_id, recorder.run_id, rows, recorder.actor
            )
        incident = load_record(session, recorder.incident_slug)
        diagnosis = build_diagnosis(
            slug=recorder.incident_slug,
            run_id=recorder.run_id,
            findings=findings,
            stack=decision.stack,
            arms=[(s, keys.get(s.arm)) for s in decision.summaries],
            observations=[
                Observation(facts, keys.get(name)) for name, facts in decision.facts.items()
            ],
            verdicts=decision.verdicts,
            changes=changes,
            keys=recorder.keys,
            errors=decision.errors,
            graph=graph_mod.summary(graph_mod.build_graph(incident)),
            cost=decision.cost,
            skipped=skipped,
            exchange_evidence=keys.get("exchange"),
            state=decision.state,
            reproduction=decision.reproduction,
        )
        if decision.gate_failed:
            diagnosis.causes = _standing_causes(incident)
        result = diagnosis.to_json()
        validate_diagnosis(result)
        runs.finish_run(session, recorder.run_id, decision.state, result)
    recorder.finished = True
    return diagnosis


def _with_keys(recorder: Recorder, row: runs.VerdictRow) -> runs.VerdictRow:
    return runs.VerdictRow(
        row.cause,
        row.status,
        row.rationale,
        recorder.keys(row.supports),
        recorder.keys(row.refutes),
        row.deciding_probe,
        row.basis,
    )


def _standing_causes(incident: JsonObject) -> list[DiagnosisCause]:
    """The causes as they stand in the incident's record (this run moved none)."""
    out: list[DiagnosisCause] = []
    for cause in incident.get("causes") or []:
        status = str(cause.get("status", "suspected"))
        out.append(
            DiagnosisCause(
                id=str(cause.get("id")),
                status=status,
                rationale=str(cause.get("rationale") or "not moved by this run"),
                evidence=[],
                deciding_probe=str(cause.get("deciding_probe") or ""),
                previous_status=status,
                undecided="the failure did not reproduce in this run"
                if status == "suspected"
                else None,
            )
        )
    return out
