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
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from scipy.stats import fisher_exact
from sqlmodel import Session, col, select

from kb.models import DECISION_KINDS, Cause, Decision, Evidence, Incident, TriageRun, utcnow
from kb.store import StoreError, get_incident

TRIGGER_KINDS = ("new-build", "new-weights", "failure-rate", "date")
SIGNIFICANCE = 0.05
DEFAULT_MIN_CAPTURES = 5
REVISIT_ARM = "revisit"
BASELINE_ARM = "baseline"
# Payload keys that carry a llama-server build ("b11434-abcdef", 11434, "11434") or a
# weights file hash; searched at any depth of an evidence payload. `sha256` alone is not
# one of them: captures use it for the hash of the raw capture.
BUILD_KEYS = ("server_build", "build", "build_number", "build_info", "system_fingerprint")
WEIGHTS_KEYS = ("weights_sha256", "weights_hash", "model_sha256", "model_hash")
STATUS_AFTER = {"PARKED": "parked", "FIXED": "fixed", "REOPENED": "reopened"}
ALLOWED_FROM = {
    "PARKED": ("open", "parked", "reopened"),
    "FIXED": ("open", "parked", "reopened"),
    "REOPENED": ("fixed", "closed"),
}
TRIGGER_SYNTAX = (
    "new-build[>BUILD] | new-weights[!=SHA256] | failure-rate[>RATE][,min=N] | date=YYYY-MM-DD"
)


class DecisionError(StoreError):
    """A decision the knowledge base refuses; the message says what is missing."""


# --------------------------------------------------------------------------- triggers


def build_number(value: Any) -> int | None:
    """The build number in `11434`, `"11434"`, `"b11434"`, `"b11434-abc1234"`, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        match = re.match(r"^\s*(?:build\s*)?[bv]?(\d+)\b", value, re.IGNORECASE)
        if match:
            return int(match.group(1))
    return None


def parse_trigger(text: str) -> dict[str, Any]:
    """A trigger from its command-line form (see TRIGGER_SYNTAX)."""
    spec = text.strip()
    match = re.fullmatch(r"(?:new-)?build(?:\s*>\s*(\S+))?", spec, re.IGNORECASE)
    if match:
        trigger: dict[str, Any] = {"kind": "new-build"}
        if match.group(1):
            after = build_number(match.group(1))
            if after is None:
                raise DecisionError(f"trigger {text!r}: {match.group(1)!r} is not a build number")
            trigger["after"] = after
        return trigger
    match = re.fullmatch(r"(?:new-)?weights(?:\s*!=\s*(\S+))?", spec, re.IGNORECASE)
    if match:
        trigger = {"kind": "new-weights"}
        if match.group(1):
            trigger["hash"] = match.group(1).lower()
        return trigger
    match = re.fullmatch(
        r"failure-rate(?:\s*>\s*([0-9.]+)(%?))?(?:\s*,\s*min\s*=\s*(\d+))?",
        spec,
        re.IGNORECASE,
    )
    if match:
        trigger = {"kind": "failure-rate"}
        if match.group(1):
            try:
                threshold = float(match.group(1))
            except ValueError:
                raise DecisionError(f"trigger {text!r}: {match.group(1)!r} is not a rate") from None
            trigger["threshold"] = threshold / 100 if match.group(2) else threshold
        if match.group(3):
            trigger["min_captures"] = int(match.group(3))
        return normalise_trigger(trigger)
    match = re.fullmatch(r"date\s*[=:]\s*(\S+)", spec, re.IGNORECASE)
    if match:
        return normalise_trigger({"kind": "date", "on": match.group(1)})
    raise DecisionError(f"unknown trigger {text!r}; expected one of: {TRIGGER_SYNTAX}")


def normalise_trigger(trigger: dict[str, Any]) -> dict[str, Any]:
    """Check a trigger dict; returns it with `kind` first (the file order)."""
    if not isinstance(trigger, dict):
        raise DecisionError(f"a trigger must be a mapping, got {trigger!r}")
    kind = trigger.get("kind")
    if kind not in TRIGGER_KINDS:
        raise DecisionError(f"unknown trigger kind {kind!r} (expected one of {TRIGGER_KINDS})")
    if kind == "failure-rate" and "threshold" in trigger:
        threshold = trigger.get("threshold")
        if (
            not isinstance(threshold, (int, float))
            or isinstance(threshold, bool)
            or not 0 <= threshold < 1
        ):
            raise DecisionError(
                f"failure-rate trigger needs a threshold between 0 and 1, got {threshold!r}"
            )
    if kind == "failure-rate":
        minimum = trigger.get("min_captures", DEFAULT_MIN_CAPTURES)
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1:
            raise DecisionError(f"failure-rate trigger: min_captures must be >= 1, got {minimum!r}")
    if kind == "date":
        _as_date(trigger.get("on"), "date trigger 'on'")
    if kind == "new-build" and "after" in trigger and build_number(trigger["after"]) is None:
        raise DecisionError(
            f"new-build trigger: 'after' is not a build number: {trigger['after']!r}"
        )
    return {"kind": kind, **{k: v for k, v in trigger.items() if k != "kind"}}


def describe_trigger(trigger: dict[str, Any]) -> str:
    """One line for people: what the trigger waits for."""
    kind = trigger.get("kind")
    if kind == "new-build":
        after = trigger.get("after")
        text = f"a llama-server build newer than b{after}" if after else "a new llama-server build"
    elif kind == "new-weights":
        known = trigger.get("hash")
        text = f"weights other than {str(known)[:12]}" if known else "a new weights file"
    elif kind == "failure-rate":
        minimum = trigger.get("min_captures", DEFAULT_MIN_CAPTURES)
        if "threshold" in trigger:
            threshold = float(trigger["threshold"])
            text = f"failure rate above {threshold:.0%} in >= {minimum} new captures"
        else:
            text = f"any failures in >= {minimum} new captures (no threshold set)"
    elif kind == "date":
        text = f"date {trigger.get('on')}"
    else:
        text = str(kind)
    note = trigger.get("note")
    return f"{text} ({note})" if note else text


def _as_date(value: Any, what: str) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise DecisionError(f"{what}: {value!r} is not a date (YYYY-MM-DD)")


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive values; the store writes UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _find_values(payload: Any, keys: Sequence[str], depth: int = 0) -> list[Any]:
    """Values under any of `keys` anywhere in a JSON payload (bounded depth)."""
    found: list[Any] = []
    if depth > 6:
        return found
    if isinstance(payload, dict):
        for key, value in payload.items():
            if key in keys and isinstance(value, (str, int)):
                found.append(value)
            elif isinstance(value, (dict, list)):
                found.extend(_find_values(value, keys, depth + 1))
    elif isinstance(payload, list):
        for value in payload[:1000]:
            found.extend(_find_values(value, keys, depth + 1))
    return found


def evidence_builds(evidence: Evidence) -> list[int]:
    """llama-server build numbers an evidence payload reports."""
    numbers = (build_number(v) for v in _find_values(evidence.payload, BUILD_KEYS))
    return sorted({n for n in numbers if n is not None})


def evidence_weights(evidence: Evidence) -> list[str]:
    """Weights-file hashes an evidence payload reports."""
    return sorted({str(v).lower() for v in _find_values(evidence.payload, WEIGHTS_KEYS) if v})


def capture_failed(payload: dict[str, Any]) -> bool | None:
    """Whether a captured exchange shows the failure: an explicit `failed`, else any finding
    that did not pass; None when the capture does not say."""
    failed = payload.get("failed")
    if isinstance(failed, bool):
        return failed
    findings = payload.get("findings")
    if isinstance(findings, list) and findings:
        verdicts = [f.get("passed") for f in findings if isinstance(f, dict)]
        if any(v is False for v in verdicts):
            return True
        if verdicts and all(v is True for v in verdicts):
            return False
    return None


# --------------------------------------------------------------------------- fix evidence


@dataclass(frozen=True)
class ArmCounts:
    """Failures out of n replays, from one or more arm evidence rows."""

    evidence_keys: tuple[str, ...]
    failures: int
    n: int
    arm: str = ""

    @property
    def rate(self) -> float:
        return self.failures / self.n if self.n else 0.0

    def describe(self) -> str:
        keys = ", ".join(self.evidence_keys)
        return f"{self.failures}/{self.n} ({self.rate:.0%}) [{keys}]"


def arm_payload(evidence: Evidence) -> dict[str, Any] | None:
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


def _incident_evidence(session: Session, incident_id: int) -> list[Evidence]:
    return list(
        session.exec(
            select(Evidence)
            .where(Evidence.incident_id == incident_id)
            .order_by(col(Evidence.recorded_at), col(Evidence.id))
        ).all()
    )


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


def one_sided_p(run: ArmCounts, baseline: ArmCounts) -> float:
    """Fisher exact p that the run fails less often than the baseline."""
    table = [
        [run.failures, run.n - run.failures],
        [baseline.failures, baseline.n - baseline.failures],
    ]
    return float(fisher_exact(table, alternative="less").pvalue)


@dataclass(frozen=True)
class FixCheck:
    """Whether the record proves a fix, and if not, what is missing."""

    verified: bool
    baseline: ArmCounts | None
    run: ArmCounts | None
    p_value: float | None
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.verified and self.run and self.baseline:
            return (
                f"failure rate {self.run.describe()} on the current stack vs baseline "
                f"{self.baseline.describe()}, one-sided Fisher p = {self.p_value:.2g}"
            )
        return "; ".join(self.missing)

    def evidence_keys(self) -> list[str]:
        keys = list(self.baseline.evidence_keys) if self.baseline else []
        if self.run:
            keys += [k for k in self.run.evidence_keys if k not in keys]
        return keys


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


def _known_build(session: Session, incident: Incident) -> int | None:
    assert incident.id is not None
    numbers = [build_number(incident.server_build)]
    numbers += [build_number(v) for v in _find_values(incident.stack, BUILD_KEYS)]
    for row in _incident_evidence(session, incident.id):
        numbers += evidence_builds(row)
    known = [n for n in numbers if n is not None]
    return max(known) if known else None


def _known_weights(session: Session, incident: Incident) -> str | None:
    assert incident.id is not None
    hashes = [str(v).lower() for v in _find_values(incident.stack, WEIGHTS_KEYS) if v]
    for row in _incident_evidence(session, incident.id):
        hashes += evidence_weights(row)
    return hashes[-1] if hashes else None


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
    triggers: Iterable[dict[str, Any] | str] = (),
    evidence_keys: Sequence[str] = (),
    force: bool = False,
    at: datetime | None = None,
) -> Decision:
    """Validate and store one decision, and set the incident's status accordingly."""
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
    revisit_date = _as_date(revisit_on, "revisit date") if revisit_on else None
    normalised = [
        parse_trigger(t) if isinstance(t, str) else normalise_trigger(t) for t in triggers
    ]
    verified = True

    if kind == "PARKED":
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
                f"{slug}: the revisit date {revisit_date} is before the decision "
                f"({decided_at.date()})"
            )
        for trigger in normalised:
            # Pin what "new" means at decision time, so the trigger reads on its own.
            if trigger["kind"] == "new-build" and "after" not in trigger:
                build = _known_build(session, incident)
                if build is not None:
                    trigger["after"] = build
            if trigger["kind"] == "new-weights" and "hash" not in trigger:
                weights = _known_weights(session, incident)
                if weights is not None:
                    trigger["hash"] = weights
    elif kind == "FIXED":
        if not fix:
            raise DecisionError(f"{slug}: FIXED needs the fix (--fix TEXT): what was changed")
        check = check_fix(session, incident, keys)
        if not check.verified and not force:
            raise DecisionError(
                f"{slug}: refusing FIXED without evidence: "
                + check.describe()
                + ". Use --force to record an unverified fix."
            )
        verified = check.verified
        keys += [k for k in check.evidence_keys() if k not in keys]
        if verified:
            summary = "Verified: " + check.describe() + "."
        else:
            summary = "UNVERIFIED fix (recorded with --force): " + check.describe() + "."
        rationale = f"{rationale} {summary}".strip() if rationale else summary
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
        revisit_triggers=normalised if kind == "PARKED" else [],
        evidence_keys=keys,
    )
    incident.status = STATUS_AFTER[kind]
    incident.updated_at = decided_at
    session.add(decision)
    session.add(incident)
    session.flush()
    return decision


# --------------------------------------------------------------------------- parked list


@dataclass(frozen=True)
class TriggerState:
    """One revisit condition of a parked incident, checked against the record."""

    trigger: dict[str, Any]
    description: str
    fired: bool
    reason: str
    evidence_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParkedIncident:
    """A parked incident: when and why to look again, and whether that time has come."""

    slug: str
    title: str
    parked_on: date | None
    decided_by: str
    rationale: str
    tradeoff: str
    fix: str
    revisit_on: date | None
    triggers: tuple[TriggerState, ...]
    state: str  # waiting | due | overdue
    reasons: tuple[str, ...]
    days_overdue: int = 0
    last_revisit: str | None = None
    evidence_keys: tuple[str, ...] = field(default_factory=tuple)

    @property
    def due(self) -> bool:
        return self.state in ("due", "overdue")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["parked_on"] = self.parked_on.isoformat() if self.parked_on else None
        data["revisit_on"] = self.revisit_on.isoformat() if self.revisit_on else None
        data["due"] = self.due
        data["triggers"] = [
            {**asdict(t), "evidence_keys": list(t.evidence_keys)} for t in self.triggers
        ]
        data["reasons"] = list(self.reasons)
        data["evidence_keys"] = list(self.evidence_keys)
        return data


def _date_state(on: date, today: date, revisit: Evidence | None, label: str) -> TriggerState:
    trigger = {"kind": "date", "on": on.isoformat()}
    if today < on:
        return TriggerState(trigger, label, False, f"{label} {on} is in {(on - today).days} day(s)")
    if revisit is not None and _aware(revisit.recorded_at).date() >= on:
        return TriggerState(
            trigger,
            label,
            False,
            f"{label} {on} passed; revisited on {_aware(revisit.recorded_at).date()} "
            f"[{revisit.key}]",
            (revisit.key,),
        )
    days = (today - on).days
    when = "today" if days == 0 else f"{days} day(s) ago"
    return TriggerState(trigger, label, True, f"{label} {on} passed {when}")


def _check_trigger(
    trigger: dict[str, Any],
    *,
    incident: Incident,
    before: list[Evidence],
    after: list[Evidence],
    today: date,
    revisit: Evidence | None,
) -> TriggerState:
    kind = trigger.get("kind")
    label = describe_trigger(trigger)
    if kind == "date":
        state = _date_state(_as_date(trigger.get("on"), "date trigger"), today, revisit, "date")
        return TriggerState(trigger, label, state.fired, state.reason, state.evidence_keys)
    if kind == "new-build":
        known = [build_number(trigger.get("after")), build_number(incident.server_build)]
        for row in before:
            known += evidence_builds(row)
        baseline = max((n for n in known if n is not None), default=None)
        for row in after:
            newer = [n for n in evidence_builds(row) if baseline is None or n > baseline]
            if newer:
                was = f" (was b{baseline})" if baseline is not None else ""
                return TriggerState(
                    trigger,
                    label,
                    True,
                    f"build b{max(newer)} seen in [{row.key}]{was}",
                    (row.key,),
                )
        shown = f"b{baseline}" if baseline is not None else "none recorded"
        return TriggerState(trigger, label, False, f"no newer build seen (known: {shown})")
    if kind == "new-weights":
        known_hashes = {str(trigger["hash"]).lower()} if trigger.get("hash") else set()
        known_hashes |= {str(v).lower() for v in _find_values(incident.stack, WEIGHTS_KEYS) if v}
        for row in before:
            known_hashes |= set(evidence_weights(row))
        for row in after:
            new = [h for h in evidence_weights(row) if h not in known_hashes]
            if new:
                return TriggerState(
                    trigger, label, True, f"weights {new[0][:12]} seen in [{row.key}]", (row.key,)
                )
        return TriggerState(trigger, label, False, "no new weights hash seen")
    if kind == "failure-rate":
        threshold = float(trigger.get("threshold", 0))
        minimum = int(trigger.get("min_captures", DEFAULT_MIN_CAPTURES))
        verdicts = [
            (row.key, verdict)
            for row in after
            if row.kind == "exchange"
            and row.incident_id == incident.id
            and (verdict := capture_failed(row.payload or {})) is not None
        ]
        failures = sum(1 for _, failed in verdicts if failed)
        n = len(verdicts)
        if n >= minimum and failures / n > threshold:
            keys = tuple(k for k, failed in verdicts if failed)
            return TriggerState(
                trigger,
                label,
                True,
                f"{failures}/{n} new captures failed ({failures / n:.0%} > {threshold:.0%})",
                keys,
            )
        return TriggerState(
            trigger, label, False, f"{failures}/{n} new captures failed (needs >= {minimum})"
        )
    return TriggerState(trigger, label, False, f"unknown trigger kind {kind!r}: check by hand")


def parked(session: Session, today: date, *, due_only: bool = False) -> list[ParkedIncident]:
    """Parked incidents with their revisit date and triggers, which are due and why.

    Evidence is read as of `today`; a `revisit` arm recorded after the decision settles the
    conditions that fired before it (the next one has to be newer than the revisit).
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
        item = _parked_item(session, incident, today, unattached)
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


def parked_incident(session: Session, incident: Incident, today: date) -> ParkedIncident:
    """The parked-list entry of one incident (as `parked` computes it), as of `today`."""
    return _parked_item(session, incident, today)


def _parked_item(
    session: Session,
    incident: Incident,
    today: date,
    unattached: list[Evidence] | None = None,
) -> ParkedIncident:
    assert incident.id is not None
    if unattached is None:
        unattached = _unattached_evidence(session, today)
    decision = latest_decision(session, incident.id)
    if decision is None or decision.kind != "PARKED":
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
            reasons=(
                "status is parked but no PARKED decision is recorded: nothing brings it back",
            ),
        )
    decided_at = _aware(decision.decided_at)
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
    before = [row for row in rows if _aware(row.recorded_at) <= settled_at]
    after = [row for row in rows if _aware(row.recorded_at) > settled_at]

    states: list[TriggerState] = []
    days_overdue = 0
    if decision.revisit_on is not None:
        state = _date_state(decision.revisit_on, today, last_revisit, "revisit date")
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
        states.append(
            _check_trigger(
                trigger,
                incident=incident,
                before=before,
                after=after,
                today=today,
                revisit=last_revisit,
            )
        )
    dates = [
        _as_date(s.trigger["on"], "date")
        for s in states
        if s.fired and s.trigger.get("kind") == "date"
    ]
    if dates:
        days_overdue = max((today - d).days for d in dates)
    fired = [s for s in states if s.fired]
    reasons: tuple[str, ...]
    if not states:
        status, reasons = "due", ("no revisit date or trigger recorded: nothing brings it back",)
    elif not fired:
        status, reasons = "waiting", tuple(s.reason for s in states)
    else:
        status = "overdue" if days_overdue > 0 else "due"
        reasons = tuple(s.reason for s in fired)
    revisit_note = None
    if last_revisit is not None:
        payload = last_revisit.payload or {}
        revisit_note = (
            f"{_aware(last_revisit.recorded_at).date()} [{last_revisit.key}]: "
            f"{payload.get('failures')}/{payload.get('n')} failed, {payload.get('decision', '')}"
        ).rstrip(", ")
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
        last_revisit=revisit_note,
        evidence_keys=tuple(decision.evidence_keys),
    )


# --------------------------------------------------------------------------- revisit inputs


def _request_of(payload: dict[str, Any]) -> dict[str, Any] | None:
    exchange = payload.get("exchange")
    for holder in (exchange, payload):
        if isinstance(holder, dict) and isinstance(holder.get("request"), dict):
            request = holder["request"]
            if isinstance(request.get("messages"), list):
                return dict(request)
    return None


def failing_requests(session: Session, incident: Incident) -> list[tuple[str, dict[str, Any]]]:
    """The incident's recorded failing exchanges as (evidence id, request body), oldest
    first, duplicates dropped. An exchange whose findings all passed is not a failure."""
    assert incident.id is not None
    seen: set[str] = set()
    found: list[tuple[str, dict[str, Any]]] = []
    for row in _incident_evidence(session, incident.id):
        if row.kind != "exchange":
            continue
        payload = row.payload or {}
        request = _request_of(payload)
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
