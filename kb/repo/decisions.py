"""Decisions on an incident (PARKED / FIXED / REOPENED) and the parked list that brings
parked incidents back.

- PARKED needs a rationale and a way back: a revisit date and/or triggers.
- FIXED needs evidence: a probe run on the current stack (by default the latest `revisit`
  arm) whose failure rate is significantly below the incident's baseline (one-sided Fisher
  exact p < 0.05). Without it the decision is refused with what is missing; `force=True`
  records the fix as unverified (`verified=False`), labelled as such.
- REOPENED: a fixed incident whose failure came back.

Every decision sets `Incident.status`. Pure of llama-server: the evidence it reads was
recorded by the engine (payload `type: arm`) and by captures (kind `exchange`).

Triggers are dicts as in the incident files (`kind` first, extra keys kept):
`{"kind": "new-build", "after": 9586}`, `{"kind": "new-weights", "hash": "..."}`,
`{"kind": "failure-rate", "threshold": 0.2, "min_captures": 5}`,
`{"kind": "date", "on": "2026-09-01"}`; each may carry a `note`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta, timezone

from sqlmodel import Session, col, select

from kb import triggers as kb_triggers
from kb.domain.decisions import (
    ALLOWED_FROM,
    BASELINE_ARM,
    REVISIT_ARM,
    SIGNIFICANCE,
    STATUS_AFTER,
    ArmCounts,
    FixCheck,
    ParkedIncident,
    one_sided_p,
    request_of,
)
from kb.domain.triggers import (
    DecisionError,
    KindLookup,
    Trigger,
    TriggerState,
    as_date,
    capture_failed,
    ids,
    stored_trigger,
    syntax,
)
from kb.domain.triggers import aware as _aware
from kb.jsontypes import JsonObject
from kb.models import DECISION_KINDS, Cause, Decision, Evidence, Incident, TriageRun, utcnow
from kb.repo.live import incident_live_counts
from kb.repo.store import get_incident
from kb.triggers import TriggerContext
from kb.triggers import incident_evidence as _incident_evidence

TRIGGER_KINDS = ids(kb_triggers.BUILTIN_KINDS)
TRIGGER_SYNTAX = syntax(kb_triggers.BUILTIN_KINDS)


# --------------------------------------------------------------------------- triggers
# One class per kind in kb/triggers.py; these functions read a registry of kinds
# (`trigger_kinds`, default the built-ins; triage passes `catalogue().triggers`).


def parse_trigger(text: str, trigger_kinds: KindLookup | None = None) -> Trigger:
    """A trigger from its command-line form (see TRIGGER_SYNTAX)."""
    return kb_triggers.parse(text, trigger_kinds)


def describe_trigger(trigger: Trigger, trigger_kinds: KindLookup | None = None) -> str:
    """One line for people: what the trigger waits for."""
    return kb_triggers.describe(trigger, trigger_kinds)


# --------------------------------------------------------------------------- fix evidence


def arm_payload(evidence: Evidence) -> JsonObject | None:
    """The payload of an engine arm evidence (type `arm` with integer n and failures)."""
    payload = evidence.payload or {}
    if payload.get("type") != "arm":
        return None
    n, failures = payload.get("n"), payload.get("failures")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, failures)):
        return None
    assert isinstance(n, int) and isinstance(failures, int)
    if n <= 0 or not 0 <= failures <= n:
        return None
    return payload


def baseline_counts(
    session: Session, incident: Incident, *, before: datetime | None = None
) -> ArmCounts | None:
    """The incident's baseline failure rate: every `baseline` arm (recorded before `before`)
    pooled; None when the incident has no measured baseline."""
    assert incident.id is not None
    keys: list[str] = []
    failures = n = 0
    for row in _incident_evidence(session, incident.id):
        payload = arm_payload(row)
        if payload is None or payload.get("arm") != BASELINE_ARM:
            continue
        if before is not None and _aware(row.recorded_at) > _aware(before):
            continue
        keys.append(row.key)
        failures += int(payload["failures"])
        n += int(payload["n"])
    return ArmCounts(tuple(keys), failures, n, BASELINE_ARM) if keys else None


def check_fix(session: Session, incident: Incident, evidence_keys: Sequence[str] = ()) -> FixCheck:
    """Check the FIXED rule: a run on the current stack significantly below the baseline.

    The run is the arm evidence named in `evidence_keys` (not a baseline arm), else the
    incident's latest `revisit` arm.
    """
    assert incident.id is not None
    rows = _incident_evidence(session, incident.id)
    by_key = {row.key: row for row in rows}
    missing: list[str] = []
    run_row: Evidence | None = None
    named_runs = [k for k in evidence_keys if k in by_key]
    for key in named_runs:
        payload = arm_payload(by_key[key])
        if payload is not None and payload.get("arm") != BASELINE_ARM:
            run_row = by_key[key]
    if run_row is None:
        revisits = [
            row
            for row in rows
            if (p := arm_payload(row)) is not None and p.get("arm") == REVISIT_ARM
        ]
        run_row = revisits[-1] if revisits else None
    run: ArmCounts | None = None
    if run_row is None:
        missing.append(
            "no probe run on the current stack: run `triage revisit "
            f"{incident.slug} --stack STACK.toml` (or name an arm evidence id)"
        )
    else:
        payload = arm_payload(run_row)
        assert payload is not None
        run = ArmCounts(
            (run_row.key,), int(payload["failures"]), int(payload["n"]), str(payload.get("arm"))
        )
    baseline = baseline_counts(session, incident, before=run_row.recorded_at if run_row else None)
    if baseline is None:
        missing.append(
            "no measured baseline failure rate (evidence with payload type 'arm', arm "
            "'baseline'): run `triage diagnose` on the failing exchange first"
        )
    elif baseline.failures == 0:
        missing.append(
            f"the baseline {baseline.describe()} never failed, so no fix can be shown against it"
        )
    p_value: float | None = None
    if run is not None and baseline is not None and baseline.failures > 0:
        p_value = one_sided_p(run, baseline)
        if not (run.rate < baseline.rate and p_value < SIGNIFICANCE):
            missing.append(
                f"the run {run.describe()} is not significantly below the baseline "
                f"{baseline.describe()} (one-sided Fisher p = {p_value:.2g}, needs < "
                f"{SIGNIFICANCE}); replay more requests or fix the cause"
            )
    return FixCheck(not missing, baseline, run, p_value, tuple(missing))


# --------------------------------------------------------------------------- decisions


def latest_decision(session: Session, incident_id: int) -> Decision | None:
    return session.exec(
        select(Decision)
        .where(Decision.incident_id == incident_id)
        .order_by(col(Decision.decided_at).desc(), col(Decision.id).desc())
    ).first()


def _check_parked(
    session: Session,
    incident: Incident,
    rationale: str,
    revisit_date: date | None,
    normalised: list[Trigger],
    decided_at: datetime,
    trigger_kinds: KindLookup | None,
) -> None:
    """PARKED needs a rationale and a way back; pins what "new" means for its triggers."""
    slug = incident.slug
    problems = []
    if not rationale:
        problems.append("a rationale (--why): why it is parked")
    if revisit_date is None and not normalised:
        problems.append(
            "a way back: a revisit date (--revisit-on YYYY-MM-DD) and/or triggers "
            f"(--when {TRIGGER_SYNTAX})"
        )
    if problems:
        raise DecisionError(f"{slug}: PARKED needs " + " and ".join(problems))
    if revisit_date is not None and revisit_date < decided_at.date():
        raise DecisionError(
            f"{slug}: the revisit date {revisit_date} is before the decision ({decided_at.date()})"
        )
    registry = kb_triggers.BUILTIN_KINDS if trigger_kinds is None else trigger_kinds
    for trigger in normalised:
        # Pin what "new" means at decision time, so the trigger reads on its own.
        kind = registry.get(trigger["kind"])
        if kind is not None:  # normalised above: always known
            kind.pin(trigger, session, incident)


def _check_fixed(
    session: Session,
    incident: Incident,
    fix: str,
    keys: list[str],
    rationale: str,
    force: bool,
) -> tuple[bool, list[str], str]:
    """FIXED needs the fix and the evidence: (verified, evidence keys, rationale)."""
    slug = incident.slug
    if not fix:
        raise DecisionError(f"{slug}: FIXED needs the fix (--fix TEXT): what was changed")
    check = check_fix(session, incident, keys)
    if not check.verified and not force:
        raise DecisionError(
            f"{slug}: refusing FIXED without evidence: "
            + check.describe()
            + ". Use --force to record an unverified fix."
        )
    keys = keys + [k for k in check.evidence_keys() if k not in keys]
    if check.verified:
        summary = "Verified: " + check.describe() + "."
    else:
        summary = "UNVERIFIED fix (recorded with --force): " + check.describe() + "."
    return check.verified, keys, f"{rationale} {summary}".strip() if rationale else summary


def record_decision(
    session: Session,
    slug: str,
    kind: str,
    *,
    rationale: str = "",
    tradeoff: str = "",
    fix: str = "",
    by: str = "",
    revisit_on: date | str | None = None,
    triggers: Iterable[Trigger | str] = (),
    evidence_keys: Sequence[str] = (),
    force: bool = False,
    at: datetime | None = None,
    trigger_kinds: KindLookup | None = None,
) -> Decision:
    """Validate and store one decision, and set the incident's status accordingly.

    `trigger_kinds` is the registry of revisit trigger kinds (default: kb's built-ins).
    """
    kind = kind.upper()
    if kind not in DECISION_KINDS:
        raise DecisionError(f"unknown decision {kind!r} (expected one of {DECISION_KINDS})")
    incident = get_incident(session, slug)
    if incident is None:
        raise DecisionError(f"no incident with slug {slug!r}")
    assert incident.id is not None
    decided_at = _aware(at) if at else utcnow()
    if incident.status not in ALLOWED_FROM[kind]:
        hint = " (record REOPENED first)" if incident.status == "fixed" and kind != "FIXED" else ""
        raise DecisionError(
            f"{slug}: cannot record {kind} while the incident is {incident.status}{hint}; "
            f"{kind} applies to incidents that are {' or '.join(ALLOWED_FROM[kind])}"
        )
    keys = list(dict.fromkeys(evidence_keys))
    known = {row.key for row in _incident_evidence(session, incident.id)}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise DecisionError(f"{slug}: unknown evidence id(s) {unknown}")
    rationale, tradeoff, fix = rationale.strip(), tradeoff.strip(), fix.strip()
    revisit_date = as_date(revisit_on, "revisit date") if revisit_on else None
    normalised = [
        kb_triggers.parse(t, trigger_kinds)
        if isinstance(t, str)
        else kb_triggers.normalise(t, trigger_kinds)
        for t in triggers
    ]
    verified = True

    if kind == "PARKED":
        _check_parked(
            session, incident, rationale, revisit_date, normalised, decided_at, trigger_kinds
        )
    elif kind == "FIXED":
        verified, keys, rationale = _check_fixed(session, incident, fix, keys, rationale, force)
    else:  # REOPENED
        if not rationale:
            raise DecisionError(f"{slug}: REOPENED needs a rationale (--why): what came back")

    decision = Decision(
        incident_id=incident.id,
        kind=kind,
        decided_at=decided_at,
        decided_by=by.strip(),
        rationale=rationale,
        tradeoff=tradeoff,
        fix=fix,
        verified=verified if kind == "FIXED" else False,
        revisit_on=revisit_date if kind == "PARKED" else None,
        revisit_triggers=[dict(t) for t in normalised] if kind == "PARKED" else [],
        evidence_keys=keys,
    )
    incident.status = STATUS_AFTER[kind]
    incident.updated_at = decided_at
    session.add(decision)
    session.add(incident)
    session.flush()
    return decision


# --------------------------------------------------------------------------- parked list


def parked(
    session: Session,
    today: date,
    *,
    due_only: bool = False,
    trigger_kinds: KindLookup | None = None,
) -> list[ParkedIncident]:
    """Parked incidents with their revisit date and triggers, which are due and why.

    Evidence is read as of `today`; a `revisit` arm recorded after the decision settles the
    conditions that fired before it (the next one has to be newer than the revisit).
    `trigger_kinds` checks the triggers (default: kb's built-in kinds).
    """
    incidents = session.exec(
        select(Incident).where(Incident.status == "parked").order_by(col(Incident.slug))
    ).all()
    # Captures not attached to any incident count for every parked incident (a new build
    # seen anywhere on the stack): read them once.
    unattached = _unattached_evidence(session, today)
    result = []
    for incident in incidents:
        assert incident.id is not None
        item = _parked_item(session, incident, today, unattached, trigger_kinds)
        if not due_only or item.due:
            result.append(item)
    return result


def _unattached_evidence(session: Session, today: date) -> list[Evidence]:
    return [
        row
        for row in session.exec(
            select(Evidence)
            .where(col(Evidence.incident_id).is_(None))
            .order_by(col(Evidence.recorded_at), col(Evidence.id))
        ).all()
        if _aware(row.recorded_at).date() <= today
    ]


def parked_incident(
    session: Session,
    incident: Incident,
    today: date,
    trigger_kinds: KindLookup | None = None,
) -> ParkedIncident:
    """The parked-list entry of one incident (as `parked` computes it), as of `today`."""
    return _parked_item(session, incident, today, None, trigger_kinds)


def _unparked(incident: Incident) -> ParkedIncident:
    return ParkedIncident(
        slug=incident.slug,
        title=incident.title,
        parked_on=None,
        decided_by="",
        rationale="",
        tradeoff="",
        fix="",
        revisit_on=None,
        triggers=(),
        state="due",
        reasons=("status is parked but no PARKED decision is recorded: nothing brings it back",),
    )


def _trigger_states(
    decision: Decision,
    context: TriggerContext,
    trigger_kinds: KindLookup | None,
) -> list[TriggerState]:
    """The revisit date (if any) and every trigger of a PARKED decision, checked."""
    states: list[TriggerState] = []
    if decision.revisit_on is not None:
        state = kb_triggers.date_state(
            decision.revisit_on, context.today, context.revisit, "revisit date"
        )
        states.append(
            TriggerState(
                {"kind": "date", "on": decision.revisit_on.isoformat()},
                f"revisit on {decision.revisit_on}",
                state.fired,
                state.reason,
                state.evidence_keys,
            )
        )
    for trigger in decision.revisit_triggers:
        states.append(kb_triggers.check(stored_trigger(trigger), context, trigger_kinds))
    return states


def _parked_item(
    session: Session,
    incident: Incident,
    today: date,
    unattached: list[Evidence] | None = None,
    trigger_kinds: KindLookup | None = None,
) -> ParkedIncident:
    assert incident.id is not None
    if unattached is None:
        unattached = _unattached_evidence(session, today)
    decision = latest_decision(session, incident.id)
    if decision is None or decision.kind != "PARKED":
        return _unparked(incident)
    decided_at = _aware(decision.decided_at)
    context = _trigger_context(session, incident, decided_at, today, unattached)
    states = _trigger_states(decision, context, trigger_kinds)
    status, reasons, days_overdue = _parked_state(states, today)
    return ParkedIncident(
        slug=incident.slug,
        title=incident.title,
        parked_on=decided_at.date(),
        decided_by=decision.decided_by,
        rationale=decision.rationale,
        tradeoff=decision.tradeoff,
        fix=decision.fix,
        revisit_on=decision.revisit_on,
        triggers=tuple(states),
        state=status,
        reasons=reasons,
        days_overdue=days_overdue,
        last_revisit=_revisit_note(context.revisit),
        evidence_keys=tuple(decision.evidence_keys),
    )


def _trigger_context(
    session: Session,
    incident: Incident,
    decided_at: datetime,
    today: date,
    unattached: list[Evidence],
) -> TriggerContext:
    """What the triggers of a parked incident are checked against, as of `today`."""
    assert incident.id is not None
    # Evidence "as of today": the incident's own plus captures not attached to any incident.
    own = [
        row
        for row in _incident_evidence(session, incident.id)
        if _aware(row.recorded_at).date() <= today
    ]
    rows = sorted([*own, *unattached], key=lambda row: (_aware(row.recorded_at), row.id or 0))
    revisits = [
        row
        for row in rows
        if row.incident_id == incident.id
        and _aware(row.recorded_at) >= decided_at
        and (p := arm_payload(row)) is not None
        and p.get("arm") == REVISIT_ARM
    ]
    last_revisit = revisits[-1] if revisits else None
    settled_at = _aware(last_revisit.recorded_at) if last_revisit else decided_at
    # What was known when parked (or last revisited, including the revisit's own build and
    # weights) against what was seen since.
    return TriggerContext(
        incident=incident,
        before=[row for row in rows if _aware(row.recorded_at) <= settled_at],
        after=[row for row in rows if _aware(row.recorded_at) > settled_at],
        today=today,
        revisit=last_revisit,
        # "As of today", like the evidence above: up to the end of `today` (UTC).
        live_counts=incident_live_counts(
            session,
            incident.id,
            settled_at,
            datetime.combine(today + timedelta(days=1), time.min, tzinfo=timezone.utc),
        ),
    )


def _parked_state(states: list[TriggerState], today: date) -> tuple[str, tuple[str, ...], int]:
    """Waiting, due or overdue (with the reasons and the days overdue) from the trigger states."""
    dates = [
        as_date(s.trigger["on"], "date")
        for s in states
        if s.fired and s.trigger.get("kind") == "date"
    ]
    days_overdue = max((today - d).days for d in dates) if dates else 0
    fired = [s for s in states if s.fired]
    reasons: tuple[str, ...]
    if not states:
        status, reasons = "due", ("no revisit date or trigger recorded: nothing brings it back",)
    elif not fired:
        status, reasons = "waiting", tuple(s.reason for s in states)
    else:
        status = "overdue" if days_overdue > 0 else "due"
        reasons = tuple(s.reason for s in fired)
    return status, reasons, days_overdue


def _revisit_note(last_revisit: Evidence | None) -> str | None:
    """One line on the last revisit run: when, which evidence, its failures and decision."""
    if last_revisit is None:
        return None
    payload = last_revisit.payload or {}
    return (
        f"{_aware(last_revisit.recorded_at).date()} [{last_revisit.key}]: "
        f"{payload.get('failures')}/{payload.get('n')} failed, {payload.get('decision', '')}"
    ).rstrip(", ")


# --------------------------------------------------------------------------- revisit inputs


def failing_requests(session: Session, incident: Incident) -> list[tuple[str, JsonObject]]:
    """The incident's recorded failing exchanges as (evidence id, request body), oldest
    first, duplicates dropped. An exchange whose findings all passed is not a failure."""
    assert incident.id is not None
    seen: set[str] = set()
    found: list[tuple[str, JsonObject]] = []
    for row in _incident_evidence(session, incident.id):
        if row.kind != "exchange":
            continue
        payload = row.payload or {}
        request = request_of(payload)
        if request is None or capture_failed(payload) is False:
            continue
        identity = json.dumps(request, sort_keys=True, default=str)
        if identity in seen:
            continue
        seen.add(identity)
        found.append((row.key, request))
    return found


def recorded_stack_source(session: Session, incident: Incident) -> str | None:
    """The stack file the incident's latest triage run used, if it recorded one."""
    run = session.exec(
        select(TriageRun)
        .where(TriageRun.incident_id == incident.id)
        .order_by(col(TriageRun.id).desc())
    ).first()
    if run is None:
        return None
    source = (run.plan or {}).get("stack_source")
    return str(source) if source else None


def live_causes(session: Session, incident: Incident) -> list[Cause]:
    """The incident's confirmed and suspected causes (not the rejected), in record order."""
    return list(
        session.exec(
            select(Cause)
            .where(
                Cause.incident_id == incident.id, col(Cause.status).in_(["confirmed", "suspected"])
            )
            .order_by(col(Cause.id))
        ).all()
    )
