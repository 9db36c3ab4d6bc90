"""The triage engine: plan -> run -> record -> decide -> Diagnosis.

- `scheduler`: looks, stopping, moot arms -- pure, behind a `Replayer` protocol;
- `replayer`: the llama-client replayer and reply scoring;
- `servers`: server lifecycle (launch, health, death);
- `recorder`: every write, through kb functions (kb/runs.py);
- `reproduction`: the gate -- the baseline must show the captured failure first;
- `known_good`: delta debugging towards the last configuration that worked;
- `intake`: what a diagnosis starts from (the exchange, its findings as records);
- `diagnosis`: arm summaries and the Diagnosis record (kb.domain.diagnosis);
- `runner`: one run; `replay`: `replay_rate` for revisits;
- `causes/`, `arms/`: the built-in catalogue plugins (causes and probe arms).
"""

from __future__ import annotations

from typing import Any, Literal, overload

from kb.domain.diagnosis import Diagnosis, Finding
from kb.domain.records import RAW_TEXT_LIMIT, Reply
from kb.jsontypes import JsonObject
from kb.models import TriageRun
from kb.repo import runs as _runs
from kb.repo.store import Store, get_incident
from triage.capture import Exchange
from triage.engine.events import (
    ArmSkipped,
    ArmsPlanned,
    Event,
    LookStarted,
    ProgressEvent,
    ProgressFn,
    RepliesIn,
)
from triage.engine.intake import Intake, exchange_findings
from triage.engine.replay import ArmResult, replay_rate
from triage.engine.replayer import classify_reply
from triage.engine.resuming import choose_run
from triage.engine.runner import ACTOR, DiagnoseOptions, Diagnoser
from triage.engine.scheduler import ArmState
from triage.engine.servers import EngineError, Server, open_server
from triage.stackfile import Stack

__all__ = [
    "ACTOR",
    "RAW_TEXT_LIMIT",
    "ArmResult",
    "ArmSkipped",
    "ArmState",
    "ArmsPlanned",
    "DiagnoseOptions",
    "Diagnoser",
    "Diagnosis",
    "EngineError",
    "Event",
    "Finding",
    "Intake",
    "LookStarted",
    "ProgressEvent",
    "ProgressFn",
    "RepliesIn",
    "Reply",
    "Server",
    "classify_reply",
    "diagnose",
    "exchange_findings",
    "latest_diagnosis",
    "latest_run_state",
    "open_server",
    "replay_rate",
    "resume",
    "run_to_resume",
    "unfinished_run",
]


def diagnose(
    store: Store,
    exchange: Exchange | Intake,
    stack: Stack,
    *,
    incident: str | None = None,
    options: DiagnoseOptions | None = None,
    progress: ProgressFn | None = None,
) -> Diagnosis:
    """Run the probes for one failing exchange (a capture, or an `Intake`: a request alone,
    or an exchange already classified) against one stack; the recorded Diagnosis. The one
    entry of the CLI, the UI, the demo, the drills and the proxy's auto-diagnose."""
    intake = exchange if isinstance(exchange, Intake) else Intake.of(exchange)
    return Diagnoser(
        store,
        stack,
        intake.request,
        exchange=intake.exchange,
        findings=intake.findings,
        incident=incident,
        options=options,
        progress=progress,
    ).run()


def latest_diagnosis(store: Store, slug: str) -> JsonObject | None:
    """The result of the incident's latest run that produced one, as stored (None: no
    diagnosis); `Diagnosis.from_json` reads it."""
    with store.session(readonly=True) as session:
        return _runs.latest_diagnosis(session, slug)


@overload
def latest_run_state(store: Store, slug: str) -> tuple[bool, str | None]: ...
@overload
def latest_run_state(
    store: Store, slug: str, *, with_stack: Literal[True]
) -> tuple[bool, str | None, str]: ...
def latest_run_state(store: Store, slug: str, *, with_stack: bool = False) -> Any:
    """(does the incident exist, the state of its latest run or None[, the run's stack
    label: its server, secrets masked, "" when not recorded])."""
    with store.session() as session:
        _runs.mark_stale_runs(session)
        run, exists = _runs.latest_result(session, slug)
        state = run.state if run is not None else None
        if not with_stack:
            return exists, state
        label = str((run.plan or {}).get("stack_label") or "") if run is not None else ""
        return exists, state, label


def unfinished_run(store: Store, slug: str | None) -> TriageRun | None:
    """The latest run to resume (interrupted, abandoned or ended with errors), optionally
    of one incident."""
    with store.session() as session:
        _runs.mark_stale_runs(session)
        return _runs.unfinished_run(session, slug)


def run_to_resume(
    store: Store,
    stack: Stack,
    *,
    request: JsonObject | None = None,
    incident: str | None = None,
) -> TriageRun:
    """The caller's own interrupted run: same stack (and request and incident, when given),
    not running in a live process; EngineError listing the runs seen when there is none or
    more than one could be meant (triage.engine.resuming)."""
    with store.session() as session:
        if incident and get_incident(session, incident) is None:
            raise EngineError(f"--incident {incident!r}: no such incident")
        candidates = _runs.resumable_runs(session, incident)
        chosen = choose_run(candidates, stack, request=request, incident=incident)
        run = session.get(TriageRun, chosen.id)
        assert run is not None
        return run


def resume(
    store: Store,
    run: TriageRun,
    stack: Stack,
    *,
    options: DiagnoseOptions | None = None,
    progress: ProgressFn | None = None,
) -> Diagnosis:
    """Continue an interrupted run from the replies it already recorded."""
    with store.session(readonly=True) as session:
        slug = _runs.run_incident_slug(session, run)
    return Diagnoser(
        store,
        stack,
        dict(run.plan["request"]),
        incident=slug,
        findings=[Finding.from_json(f) for f in run.plan.get("findings") or []],
        options=options,
        progress=progress,
        run_id=run.id,
        exchange_evidence=str(run.plan.get("exchange_evidence") or "") or None,
    ).run()
