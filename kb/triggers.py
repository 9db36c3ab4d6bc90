"""Revisit trigger kinds: what brings a parked incident back, one class per kind.

A trigger is a `Trigger` record as in the incident files (`kind` first, extra keys kept),
e.g. `{"kind": "new-build", "after": 9586}`; it, the state a check reports and the shared
value rules are pure, in kb.domain.triggers. A kind is an object with:

    id          the `kind` string
    syntax      its command-line form (`--when`), shown in help and errors
    parse       command-line text -> trigger dict, or None when the text is another kind's
    normalise   check a trigger dict's values (raise DecisionError naming the bad one)
    describe    one line for people
    pin         at PARKED time, fill in what "new" means now (the build, the weights hash)
    check       -> TriggerState: has it fired, given the evidence before and after?

`TriggerKinds` is the registry kb.repo.decisions reads; `BUILTIN_KINDS` holds the four kinds
below. triage's catalogue exposes the same registry as `catalogue().triggers`: this module's
`register(catalogue)` is the entry point that adds the built-ins, and a plugin adds a kind
with one module of its own. kb functions take the registry as `trigger_kinds` (default:
the built-ins), so kb never imports triage.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol, cast

from sqlmodel import Session, col, select

from kb.domain.triggers import (
    BUILD_KEYS,
    DEFAULT_MIN_CAPTURES,
    WEIGHTS_KEYS,
    DecisionError,
    KindLookup,
    Trigger,
    TriggerState,
    as_date,
    aware,
    build_number,
    capture_failed,
    find_values,
    ids,
    labelled,
    syntax,
)
from kb.models import Evidence, Incident

# A trigger-kind plugin writes against this module: the records it returns and raises
# (kb.domain.triggers) are part of that surface.
__all__ = [
    "BUILTIN_KINDS",
    "DecisionError",
    "Trigger",
    "TriggerState",
    "BaseKind",
    "DateTrigger",
    "FailureRate",
    "NewBuild",
    "NewWeights",
    "TriggerContext",
    "TriggerKind",
    "TriggerKinds",
    "check",
    "date_state",
    "describe",
    "evidence_builds",
    "evidence_weights",
    "incident_evidence",
    "normalise",
    "parse",
    "register",
]


# --------------------------------------------------------------------------- helpers


def evidence_builds(evidence: Evidence) -> list[int]:
    """llama-server build numbers an evidence payload reports."""
    numbers = (build_number(v) for v in find_values(evidence.payload, BUILD_KEYS))
    return sorted({n for n in numbers if n is not None})


def evidence_weights(evidence: Evidence) -> list[str]:
    """Weights-file hashes an evidence payload reports."""
    return sorted({str(v).lower() for v in find_values(evidence.payload, WEIGHTS_KEYS) if v})


def incident_evidence(session: Session, incident_id: int) -> list[Evidence]:
    """An incident's evidence, oldest first."""
    return list(
        session.exec(
            select(Evidence)
            .where(Evidence.incident_id == incident_id)
            .order_by(col(Evidence.recorded_at), col(Evidence.id))
        ).all()
    )


# --------------------------------------------------------------------------- protocol


@dataclass(frozen=True)
class TriggerContext:
    """What a trigger is checked against: evidence known when the incident was parked (or
    last revisited) and evidence seen since, as of `today`."""

    incident: Incident
    before: list[Evidence]
    after: list[Evidence]
    today: date
    revisit: Evidence | None
    # (failures, exchanges) the live proxy recorded for the incident's signatures since it
    # was parked or revisited; None when the proxy never tracked it (kb/live.py).
    live_counts: tuple[int, int] | None = None


class TriggerKind(Protocol):
    """One revisit trigger kind (see the module docstring)."""

    @property
    def id(self) -> str: ...

    @property
    def syntax(self) -> str: ...

    def parse(self, text: str) -> Trigger | None: ...

    def normalise(self, trigger: Trigger) -> None: ...

    def describe(self, trigger: Trigger) -> str: ...

    def pin(self, trigger: Trigger, session: Session, incident: Incident) -> None: ...

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState: ...


class TriggerKinds:
    """An ordered id -> TriggerKind registry that refuses duplicates."""

    def __init__(self, kinds: Sequence[TriggerKind] = ()) -> None:
        self._kinds: dict[str, TriggerKind] = {}
        for kind in kinds:
            self.add(kind)

    def add(self, kind: TriggerKind) -> TriggerKind:
        if kind.id in self._kinds:
            raise ValueError(f"trigger kind {kind.id!r} is already registered")
        self._kinds[kind.id] = kind
        return kind

    def get(self, kind_id: str) -> TriggerKind | None:
        return self._kinds.get(kind_id)

    def __iter__(self) -> Iterator[TriggerKind]:
        return iter(list(self._kinds.values()))


class BaseKind:
    """Defaults for a trigger kind: no values to check, nothing to pin."""

    id = ""
    syntax = ""

    def parse(self, text: str) -> Trigger | None:
        return {"kind": self.id} if text.strip().lower() == self.id else None

    def normalise(self, trigger: Trigger) -> None:
        return None

    def describe(self, trigger: Trigger) -> str:
        return self.id

    def pin(self, trigger: Trigger, session: Session, incident: Incident) -> None:
        return None

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState:
        return TriggerState(trigger, self.describe(trigger), False, "not checked")


# --------------------------------------------------------------------------- built-in kinds


def known_build(session: Session, incident: Incident) -> int | None:
    """The newest build the incident's record names (stack and evidence)."""
    assert incident.id is not None
    numbers = [build_number(incident.server_build)]
    numbers += [build_number(v) for v in find_values(incident.stack, BUILD_KEYS)]
    for row in incident_evidence(session, incident.id):
        numbers += evidence_builds(row)
    known = [n for n in numbers if n is not None]
    return max(known) if known else None


def known_weights(session: Session, incident: Incident) -> str | None:
    """The latest weights hash the incident's record names (stack and evidence)."""
    assert incident.id is not None
    hashes = [str(v).lower() for v in find_values(incident.stack, WEIGHTS_KEYS) if v]
    for row in incident_evidence(session, incident.id):
        hashes += evidence_weights(row)
    return hashes[-1] if hashes else None


class NewBuild(BaseKind):
    """A llama-server build newer than the one the incident was parked on."""

    id = "new-build"
    syntax = "new-build[>BUILD]"

    def parse(self, text: str) -> Trigger | None:
        match = re.fullmatch(r"(?:new-)?build(?:\s*>\s*(\S+))?", text.strip(), re.IGNORECASE)
        if not match:
            return None
        trigger: Trigger = {"kind": self.id}
        if match.group(1):
            after = build_number(match.group(1))
            if after is None:
                raise DecisionError(f"trigger {text!r}: {match.group(1)!r} is not a build number")
            trigger["after"] = after
        return trigger

    def normalise(self, trigger: Trigger) -> None:
        if "after" in trigger and build_number(trigger["after"]) is None:
            raise DecisionError(
                f"new-build trigger: 'after' is not a build number: {trigger['after']!r}"
            )

    def describe(self, trigger: Trigger) -> str:
        after = trigger.get("after")
        return f"a llama-server build newer than b{after}" if after else "a new llama-server build"

    def pin(self, trigger: Trigger, session: Session, incident: Incident) -> None:
        if "after" not in trigger:
            build = known_build(session, incident)
            if build is not None:
                trigger["after"] = build

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState:
        label = labelled(self.describe(trigger), trigger)
        known = [build_number(trigger.get("after")), build_number(context.incident.server_build)]
        for row in context.before:
            known += evidence_builds(row)
        baseline = max((n for n in known if n is not None), default=None)
        for row in context.after:
            newer = [n for n in evidence_builds(row) if baseline is None or n > baseline]
            if newer:
                was = f" (was b{baseline})" if baseline is not None else ""
                reason = f"build b{max(newer)} seen in [{row.key}]{was}"
                return TriggerState(trigger, label, True, reason, (row.key,))
        shown = f"b{baseline}" if baseline is not None else "none recorded"
        return TriggerState(trigger, label, False, f"no newer build seen (known: {shown})")


class NewWeights(BaseKind):
    """A weights file whose hash the record has not seen."""

    id = "new-weights"
    syntax = "new-weights[!=SHA256]"

    def parse(self, text: str) -> Trigger | None:
        match = re.fullmatch(r"(?:new-)?weights(?:\s*!=\s*(\S+))?", text.strip(), re.IGNORECASE)
        if not match:
            return None
        trigger: Trigger = {"kind": self.id}
        if match.group(1):
            trigger["hash"] = match.group(1).lower()
        return trigger

    def describe(self, trigger: Trigger) -> str:
        known = trigger.get("hash")
        return f"weights other than {str(known)[:12]}" if known else "a new weights file"

    def pin(self, trigger: Trigger, session: Session, incident: Incident) -> None:
        if "hash" not in trigger:
            weights = known_weights(session, incident)
            if weights is not None:
                trigger["hash"] = weights

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState:
        label = labelled(self.describe(trigger), trigger)
        known = {str(trigger["hash"]).lower()} if trigger.get("hash") else set()
        known |= {str(v).lower() for v in find_values(context.incident.stack, WEIGHTS_KEYS) if v}
        for row in context.before:
            known |= set(evidence_weights(row))
        for row in context.after:
            new = [h for h in evidence_weights(row) if h not in known]
            if new:
                reason = f"weights {new[0][:12]} seen in [{row.key}]"
                return TriggerState(trigger, label, True, reason, (row.key,))
        return TriggerState(trigger, label, False, "no new weights hash seen")


class FailureRate(BaseKind):
    """New captures of the incident fail more often than a threshold."""

    id = "failure-rate"
    syntax = "failure-rate[>RATE][,min=N]"

    def parse(self, text: str) -> Trigger | None:
        match = re.fullmatch(
            r"failure-rate(?:\s*>\s*([0-9.]+)(%?))?(?:\s*,\s*min\s*=\s*(\d+))?",
            text.strip(),
            re.IGNORECASE,
        )
        if not match:
            return None
        trigger: Trigger = {"kind": self.id}
        if match.group(1):
            try:
                threshold = float(match.group(1))
            except ValueError:
                raise DecisionError(f"trigger {text!r}: {match.group(1)!r} is not a rate") from None
            trigger["threshold"] = threshold / 100 if match.group(2) else threshold
        if match.group(3):
            trigger["min_captures"] = int(match.group(3))
        return trigger

    def normalise(self, trigger: Trigger) -> None:
        if "threshold" in trigger:
            threshold = trigger.get("threshold")
            if (
                not isinstance(threshold, (int, float))
                or isinstance(threshold, bool)
                or not 0 <= threshold < 1
            ):
                raise DecisionError(
                    f"failure-rate trigger needs a threshold between 0 and 1, got {threshold!r}"
                )
        minimum = trigger.get("min_captures", DEFAULT_MIN_CAPTURES)
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1:
            raise DecisionError(f"failure-rate trigger: min_captures must be >= 1, got {minimum!r}")

    def describe(self, trigger: Trigger) -> str:
        minimum = trigger.get("min_captures", DEFAULT_MIN_CAPTURES)
        if "threshold" in trigger:
            threshold = float(trigger["threshold"])
            return f"failure rate above {threshold:.0%} in >= {minimum} new captures"
        return f"any failures in >= {minimum} new captures (no threshold set)"

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState:
        label = labelled(self.describe(trigger), trigger)
        threshold = float(trigger.get("threshold", 0))
        minimum = int(trigger.get("min_captures", DEFAULT_MIN_CAPTURES))
        if context.live_counts is not None and context.live_counts[1] > 0:
            # The proxy keeps every failure but only samples successes as evidence, so the
            # attached captures would overstate the rate: use its full counts instead.
            failures, n = context.live_counts
            if n >= minimum and failures / n > threshold:
                reason = (
                    f"{failures}/{n} live exchanges failed since parked "
                    f"({failures / n:.0%} > {threshold:.0%})"
                )
                return TriggerState(trigger, label, True, reason)
            reason = f"{failures}/{n} live exchanges failed since parked (needs >= {minimum})"
            return TriggerState(trigger, label, False, reason)
        verdicts = [
            (row.key, verdict)
            for row in context.after
            if row.kind == "exchange"
            and row.incident_id == context.incident.id
            and (verdict := capture_failed(row.payload or {})) is not None
        ]
        failures = sum(1 for _, failed in verdicts if failed)
        n = len(verdicts)
        if n >= minimum and failures / n > threshold:
            keys = tuple(k for k, failed in verdicts if failed)
            reason = f"{failures}/{n} new captures failed ({failures / n:.0%} > {threshold:.0%})"
            return TriggerState(trigger, label, True, reason, keys)
        reason = f"{failures}/{n} new captures failed (needs >= {minimum})"
        return TriggerState(trigger, label, False, reason)


def date_state(on: date, today: date, revisit: Evidence | None, label: str) -> TriggerState:
    """A date condition: fired once `on` has passed, unless a revisit since settled it."""
    trigger: Trigger = {"kind": "date", "on": on.isoformat()}
    if today < on:
        return TriggerState(trigger, label, False, f"{label} {on} is in {(on - today).days} day(s)")
    if revisit is not None and aware(revisit.recorded_at).date() >= on:
        return TriggerState(
            trigger,
            label,
            False,
            f"{label} {on} passed; revisited on {aware(revisit.recorded_at).date()} "
            f"[{revisit.key}]",
            (revisit.key,),
        )
    days = (today - on).days
    when = "today" if days == 0 else f"{days} day(s) ago"
    return TriggerState(trigger, label, True, f"{label} {on} passed {when}")


class DateTrigger(BaseKind):
    """A date (besides the decision's own revisit date)."""

    id = "date"
    syntax = "date=YYYY-MM-DD"

    def parse(self, text: str) -> Trigger | None:
        match = re.fullmatch(r"date\s*[=:]\s*(\S+)", text.strip(), re.IGNORECASE)
        return {"kind": self.id, "on": match.group(1)} if match else None

    def normalise(self, trigger: Trigger) -> None:
        as_date(trigger.get("on"), "date trigger 'on'")

    def describe(self, trigger: Trigger) -> str:
        return f"date {trigger.get('on')}"

    def check(self, trigger: Trigger, context: TriggerContext) -> TriggerState:
        on = as_date(trigger.get("on"), "date trigger")
        state = date_state(on, context.today, context.revisit, "date")
        return TriggerState(
            trigger,
            labelled(self.describe(trigger), trigger),
            state.fired,
            state.reason,
            state.evidence_keys,
        )


BUILTIN_KINDS = TriggerKinds([NewBuild(), NewWeights(), FailureRate(), DateTrigger()])


def register(catalogue: Any) -> None:
    """Entry point: the built-in trigger kinds into `catalogue.triggers`."""
    for kind in BUILTIN_KINDS:
        catalogue.triggers.add(kind)


# --------------------------------------------------------------------------- dict level


def _lookup(kinds: KindLookup | None) -> KindLookup:
    return BUILTIN_KINDS if kinds is None else kinds


def parse(text: str, kinds: KindLookup | None = None) -> Trigger:
    """A trigger from its command-line form (the first kind whose syntax matches)."""
    registry = _lookup(kinds)
    for kind in registry:
        trigger = kind.parse(text)
        if trigger is not None:
            return normalise(trigger, registry)
    raise DecisionError(f"unknown trigger {text!r}; expected one of: {syntax(registry)}")


def normalise(trigger: Any, kinds: KindLookup | None = None) -> Trigger:
    """Check a trigger dict; returns it with `kind` first (the file order)."""
    registry = _lookup(kinds)
    if not isinstance(trigger, dict):
        raise DecisionError(f"a trigger must be a mapping, got {trigger!r}")
    kind_id = trigger.get("kind")
    kind = registry.get(kind_id) if isinstance(kind_id, str) else None
    if kind is None:
        raise DecisionError(f"unknown trigger kind {kind_id!r} (expected one of {ids(registry)})")
    kind.normalise(trigger)
    # Checked above; the kind's own keys are kept as written (a plugin's too).
    return cast(Trigger, {"kind": kind_id, **{k: v for k, v in trigger.items() if k != "kind"}})


def describe(trigger: Trigger, kinds: KindLookup | None = None) -> str:
    """One line for people: what the trigger waits for (and its note)."""
    kind_id = trigger.get("kind")
    kind = _lookup(kinds).get(kind_id) if isinstance(kind_id, str) else None
    return labelled(kind.describe(trigger) if kind is not None else str(kind_id), trigger)


def check(
    trigger: Trigger, context: TriggerContext, kinds: KindLookup | None = None
) -> TriggerState:
    """Whether one trigger has fired; an unknown kind (its plugin is gone) is shown, not lost."""
    kind_id = trigger.get("kind")
    kind = _lookup(kinds).get(kind_id) if isinstance(kind_id, str) else None
    if kind is None:
        return TriggerState(
            trigger,
            describe(trigger, kinds),
            False,
            f"unknown trigger kind {kind_id!r}: check by hand",
        )
    return kind.check(trigger, context)  # type: ignore[no-any-return]
