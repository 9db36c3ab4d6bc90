"""What the UI writes, and its calls into the engine and the revisit.

Pages call these; each write is one call of the knowledge-base service
(`kb.service.KnowledgeBase`). A decision is `record_decision` (kb.repo.decisions' rules, the same
as `triage decide`); a status override is `change_cause_status`, so it lands in the cause's
history like an engine change; a revisit is `triage.revisit.revisit_incident`, the function
`triage revisit` uses. The knowledge base checks what it stores and its `StoreError` says
what is wrong; the UI adds only what its forms require on top (who decides, and why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from kb.domain.errors import StoreError
from kb.domain.triggers import DecisionError
from kb.service import DecisionRequest, KnowledgeBase, RecordedDecision, StatusChange
from triage import capture, engine, stackfile
from triage.catalogue import catalogue
from triage.revisit import ReplayRate, RevisitResult, revisit_incident


class ActionError(Exception):
    """A write the UI refuses before it reaches the store; the message says what is missing."""


@dataclass
class DecisionInput:
    """A decision as typed into the Incident page's form."""

    kind: str
    by: str
    rationale: str
    tradeoff: str = ""
    fix: str = ""
    revisit_on: date | None = None
    # Triggers in the CLI's syntax (kb.repo.decisions.TRIGGER_SYNTAX), one per entry.
    triggers: list[str] = field(default_factory=list)
    evidence_keys: list[str] = field(default_factory=list)
    # Record a FIXED decision even when the evidence does not verify it (labelled unverified).
    force: bool = False

    def problems(self) -> list[str]:
        """What the form requires beyond kb's rules: a person's name and a reason for every
        decision (kb checks the kind, the status, the evidence and the triggers)."""
        found = []
        if not self.by.strip():
            found.append("say who decides")
        if not self.rationale.strip():
            found.append("say why")
        return found

    def request(self) -> DecisionRequest:
        return DecisionRequest(
            kind=self.kind,
            by=self.by,
            rationale=self.rationale,
            tradeoff=self.tradeoff,
            fix=self.fix,
            revisit_on=self.revisit_on,
            triggers=tuple(self.triggers),
            evidence_keys=tuple(self.evidence_keys),
            force=self.force,
        )


def record_decision(kb: KnowledgeBase, slug: str, decision: DecisionInput) -> RecordedDecision:
    """Record PARKED / FIXED / REOPENED (the incident status moves with it); a decision kb
    refuses raises its StoreError (DecisionError) saying what is missing."""
    problems = decision.problems()
    if problems:
        raise ActionError("; ".join(problems))
    return kb.record_decision(slug, decision.request(), catalogue().triggers)


def override_cause_status(
    kb: KnowledgeBase,
    slug: str,
    cause_key: str,
    to_status: str,
    *,
    actor: str,
    rationale: str,
    evidence_keys: list[str] | None = None,
) -> StatusChange:
    """A person moves a cause to another status; kept in the cause's history like any change.
    The knowledge base checks the status, the actor, the rationale and the evidence ids."""
    return kb.change_cause_status(
        slug,
        cause_key,
        to_status,
        actor=actor,
        rationale=rationale,
        evidence_keys=tuple(evidence_keys or ()),
    )


# --------------------------------------------------------------------------- new triage


@dataclass
class TriageInput:
    exchange: bytes
    exchange_name: str
    stack_text: str
    stack_base: Path
    exchange_format: str = "auto"
    response: bytes | None = None
    exchange_index: int = 0


def prepare(triage: TriageInput) -> tuple[capture.Exchange, stackfile.Stack]:
    """Parse and validate the exchange and the stack; raises ValueError with a readable message."""
    if not triage.exchange.strip():
        raise ValueError("paste or upload the failing exchange")
    if not triage.stack_text.strip():
        raise ValueError("paste or upload the stack file (stack.toml)")
    try:
        exchanges = capture.parse(
            triage.exchange,
            format=triage.exchange_format,
            file=triage.exchange_name,
            response=triage.response,
            # A pasted or uploaded exchange has no folder of its own: `-d @PATH` is refused
            # rather than read from beside the stack file (or anywhere else on the host).
            base_dir=None,
        )
    except capture.CaptureError as exc:
        raise ValueError(f"exchange: {exc}") from exc
    if not exchanges:
        raise ValueError("exchange: the capture holds no exchange")
    if not 0 <= triage.exchange_index < len(exchanges):
        raise ValueError(
            f"exchange: pick an exchange between 1 and {len(exchanges)} (the capture holds "
            f"{len(exchanges)})"
        )
    try:
        stack = stackfile.parse_stack(
            triage.stack_text, base=triage.stack_base, source="stack.toml"
        )
    except stackfile.StackError as exc:
        raise ValueError(f"stack: {exc}") from exc
    return exchanges[triage.exchange_index], stack


Progress = Callable[[float, str], None]


def _progress_adapter(report: Progress) -> Callable[[Any], None]:
    """The engine's ProgressEvent(stage, message, done, total) as (fraction, text)."""
    state = {"fraction": 0.0}

    def callback(event: Any) -> None:
        done = getattr(event, "done", 0) or 0
        total = getattr(event, "total", 0) or 0
        if total:
            state["fraction"] = min(1.0, max(state["fraction"], float(done) / float(total)))
        stage = str(getattr(event, "stage", "") or "")
        message = str(getattr(event, "message", "") or "")
        report(state["fraction"], f"{stage}: {message}" if stage and message else stage or message)

    return callback


def run_triage(
    kb: KnowledgeBase,
    exchange: capture.Exchange,
    stack: stackfile.Stack,
    progress: Progress,
    *,
    max_requests: int | None = None,
    incident: str | None = None,
) -> engine.Diagnosis:
    """Classify the exchange, run the engine's probes, return the diagnosis."""
    options = engine.DiagnoseOptions()
    if max_requests:
        options.max_requests = int(max_requests)
    try:
        diagnosis = engine.diagnose(
            kb.store,
            exchange,
            stack,
            incident=incident or None,
            options=options,
            progress=_progress_adapter(progress),
        )
    except (engine.EngineError, StoreError) as exc:
        raise ValueError(f"engine: {exc}") from exc
    progress(1.0, "done")
    return diagnosis


# --------------------------------------------------------------------------- revisit


def revisit(
    kb: KnowledgeBase,
    slug: str,
    stack_path: Path | None = None,
    *,
    max_requests: int = 32,
    replay_rate: ReplayRate | None = None,
) -> RevisitResult:
    """Re-probe a parked or fixed incident on the current stack and record the run as
    evidence (what `triage revisit` does); the proposal is for a person to decide."""
    try:
        return revisit_incident(
            kb.store, slug, stack_path, max_requests=max_requests, replay_rate=replay_rate
        )
    except (DecisionError, stackfile.StackError, engine.EngineError) as exc:
        raise ActionError(str(exc)) from exc
