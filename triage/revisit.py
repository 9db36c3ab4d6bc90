"""Re-probe an incident on the current stack and propose FIXED, PARKED or REOPENED.

`revisit_incident` replays the incident's recorded failing exchanges (and, while the
failure is still there, the deciding probes of its confirmed and suspected causes) on the
stack it is given, records each run as evidence (one transaction), and returns a typed
`RevisitResult`: the before/after failure rates, the probes, and the proposal. It decides
nothing: a person records the decision (`triage decide`, the UI's decision form).

Used by the CLI (`triage revisit`, which only prints) and the UI (triage/ui/actions.py).
The replays go through a `ReplayRate` (default: the engine's `replay_rate`, which launches
the stack's llama-server); tests pass their own instead of patching module attributes.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypedDict

from kb.domain.decisions import REVISIT_ARM, ArmCounts
from kb.domain.triggers import DecisionError
from kb.jsontypes import JsonObject
from kb.models import utcnow
from kb.repo import decisions as kb_decisions
from kb.repo.store import Store, add_evidence, require_incident
from triage.engine import replay_rate as engine_replay_rate
from triage.engine.servers import safe_describe
from triage.llama.build import binary_build_info, find_server_binary
from triage.probes import request_arms
from triage.stackfile import ServerDescription, Stack, load_stack

__all__ = [
    "PROPOSALS",
    "REVISITABLE",
    "ProbeOutcome",
    "Rate",
    "ReplayOutcome",
    "ReplayRate",
    "RevisitResult",
    "revisit_incident",
]

REVISITABLE = ("parked", "fixed", "reopened", "open")
PROPOSALS = ("FIXED", "PARKED", "REOPENED", "FIXED-holds", "none")


class ReplayOutcome(Protocol):
    """What a replay run reports (the engine's ArmResult has these and more)."""

    n: int
    failures: int
    decision: str


class ReplayRate(Protocol):
    """Replays request bodies on a stack against a baseline (failures, n)."""

    def __call__(
        self,
        stack: Stack,
        request_bodies: list[JsonObject],
        *,
        max_requests: int,
        baseline: tuple[int, int] | None = None,
        log_dir: Path | None = None,
    ) -> ReplayOutcome: ...


@dataclass(frozen=True)
class Rate:
    """A failure rate: `failures` of `n`, with its interval, p-value and decision."""

    failures: int
    n: int
    rate: float | None = None
    ci95: list[float] | None = None
    p_value: float | None = None
    decision: str = ""
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeOutcome:
    """A deciding probe replayed on the current stack, for the causes it decides."""

    probe: str
    failures: int
    n: int
    decision: str
    causes: tuple[str, ...] = ()


@dataclass
class RevisitResult:
    """What one revisit measured and what it proposes."""

    slug: str
    status: str
    proposal: str  # one of PROPOSALS
    message: str
    evidence: list[str] = field(default_factory=list)
    before: Rate | None = None
    after: Rate | None = None
    probes: list[ProbeOutcome] = field(default_factory=list)
    errored: bool = False

    def to_dict(self) -> JsonObject:
        """The JSON of `triage revisit --json` (one entry of `revisits`)."""
        before = None
        if self.before is not None:
            before = {
                "failures": self.before.failures,
                "n": self.before.n,
                "evidence": list(self.before.evidence),
            }
        after: JsonObject = {}
        if self.after is not None:
            after = {
                "failures": self.after.failures,
                "n": self.after.n,
                "rate": self.after.rate,
                "ci95": self.after.ci95,
                "p_value": self.after.p_value,
                "decision": self.after.decision,
            }
        return {
            "slug": self.slug,
            "status": self.status,
            "proposal": self.proposal,
            "message": self.message,
            "evidence": self.evidence,
            "before": before,
            "after": after,
            "probes": [
                {"probe": p.probe, "failures": p.failures, "n": p.n, "decision": p.decision}
                for p in self.probes
            ],
            "errored": self.errored,
        }


@dataclass
class _Plan:
    """What the store says about the incident before anything is replayed."""

    status: str
    requests: list[tuple[str, JsonObject]]  # (evidence key, request body as recorded)
    baseline: ArmCounts | None
    source: str
    deciding: list[tuple[str, str]]  # (cause key, deciding probe)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class StackFacts(TypedDict, total=False):
    """What the current stack is (the `stack` of the revisit's evidence payload)."""

    source: str
    server: ServerDescription
    weights_sha256: str
    build_number: Any  # as the binary reports it
    binary: str
    build_error: str


@dataclass
class _ArmRun:
    """One replay run of the revisit (the recorded requests, or one deciding probe); stored
    as a measurement's payload (`payload()`, keys in the order they always had)."""

    arm: str
    variant: str
    n: int
    failures: int
    ci95: Any
    p_value: Any
    decision: str
    extras: list[tuple[str, Any]]  # error, log_tail, kinds, ... when the result has them
    baseline: tuple[int, int] | None
    baseline_evidence: list[str] | None = None
    stack: StackFacts | None = None
    requests: list[str] | None = None
    causes: list[str] | None = None

    @property
    def rate(self) -> float | None:
        return round(self.failures / self.n, 4) if self.n else None

    @property
    def error(self) -> Any:
        return dict(self.extras).get("error")

    def payload(self) -> JsonObject:
        payload: JsonObject = {
            "type": "arm",
            "arm": self.arm,
            "variant": self.variant,
            "level": "revisit",
            "n": self.n,
            "failures": self.failures,
            "rate": self.rate,
            "ci95": self.ci95,
            "p_value": self.p_value,
            "decision": self.decision,
        }
        payload.update(self.extras)
        if self.baseline is not None:
            payload["baseline"] = {"failures": self.baseline[0], "n": self.baseline[1]}
            if self.baseline_evidence is not None:
                payload["baseline"]["evidence"] = self.baseline_evidence
        if self.stack is not None:
            payload["stack"] = self.stack
        if self.requests is not None:
            payload["requests"] = self.requests
        if self.causes is not None:
            payload["causes"] = self.causes
        return payload


def _stack_facts(stack: Stack) -> StackFacts:
    """What the current stack is: its server, build number and weights hash (best effort:
    a missing fact is recorded as missing, the revisit still runs)."""
    facts: StackFacts = {"source": str(stack.source), "server": safe_describe(stack.server)}
    model = stack.server.model
    if model is not None and Path(model).is_file():
        facts["weights_sha256"] = _sha256(Path(model))
    if stack.server.url and model is None:
        return facts  # a running server: its build comes from the replies, if at all
    try:
        binary = stack.server.binary
        if binary is None or "/" not in str(binary):
            found = shutil.which(str(binary)) if binary is not None else None
            binary = Path(found) if found else find_server_binary()
        info = binary_build_info(binary)
        facts["build_number"] = info.get("build_number")
        facts["binary"] = str(binary)
    except Exception as exc:  # noqa: BLE001 - a fact we could not read, not a failure
        facts["build_error"] = str(exc)
    return facts


def _rate(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else f"{k}/{n}"


def _arm_run(result: Any, arm: str, variant: str, baseline: tuple[int, int] | None) -> _ArmRun:
    ci = getattr(result, "ci95", None)
    if ci is not None and not isinstance(ci, list):
        ci = list(ci.as_list()) if hasattr(ci, "as_list") else [ci[0], ci[1]]
    extras = []
    for extra in ("error", "log_tail", "kinds", "speed_tok_s", "build_info", "stopped"):
        value = getattr(result, extra, None)
        if value not in (None, "", [], {}):
            extras.append((extra, value))
    return _ArmRun(
        arm=arm,
        variant=variant,
        n=int(result.n),
        failures=int(result.failures),
        ci95=ci,
        p_value=getattr(result, "p_value", None),
        decision=str(getattr(result, "decision", "")),
        extras=extras,
        baseline=baseline,
    )


def _summary_line(label: str, run: _ArmRun, base: ArmCounts | None) -> str:
    text = f"{label}: {_rate(run.failures, run.n)} failed"
    ci = run.ci95
    if isinstance(ci, list) and len(ci) == 2:
        text += f", 95% CI {float(ci[0]):.2f}-{float(ci[1]):.2f}"
    if base is not None:
        text += f" vs baseline {_rate(base.failures, base.n)}"
    if run.p_value is not None:
        text += f", p={float(run.p_value):.2g}"
    return text + f"; {run.decision or 'no decision'}"


def _plan(store: Store, slug: str, stack_path: Path | None) -> _Plan:
    """Read what the revisit needs; refuse an incident that cannot be revisited."""
    with store.session(readonly=True) as session:
        incident = require_incident(session, slug)
        if incident.status not in REVISITABLE:
            raise DecisionError(f"{slug} is {incident.status}: nothing to revisit")
        plan = _Plan(
            status=incident.status,
            requests=kb_decisions.failing_requests(session, incident),
            baseline=kb_decisions.baseline_counts(session, incident),
            source=(
                str(stack_path)
                if stack_path
                else kb_decisions.recorded_stack_source(session, incident) or ""
            ),
            deciding=[
                (cause.key, cause.deciding_probe)
                for cause in kb_decisions.live_causes(session, incident)
                if cause.deciding_probe
            ],
        )
    if not plan.requests:
        raise DecisionError(
            f"{slug}: no recorded failing exchange to replay (evidence of kind 'exchange' "
            "with a request): run `triage diagnose` or `triage capture --incident "
            f"{slug}` first"
        )
    if not plan.source:
        raise DecisionError(f"{slug}: no stack recorded for this incident; pass --stack STACK.toml")
    if not Path(plan.source).is_file():
        raise DecisionError(f"{slug}: stack file {plan.source} not found; pass --stack STACK.toml")
    return plan


def _probe_payloads(
    replay: ReplayRate,
    stack: Stack,
    bodies: list[JsonObject],
    plan: _Plan,
    after: _ArmRun,
    *,
    max_requests: int,
    run_dir: Path | None,
) -> list[tuple[str, _ArmRun]]:
    """While the failure is still there: do the deciding probes of the live causes still (or
    now) remove it on this stack? Request-level probes only; one run per probe."""
    if not after.failures or after.decision in ("errored", "removes"):
        return []
    transforms = {arm.name: arm.transform for arm in request_arms(bodies[0])}
    by_probe: dict[str, list[str]] = {}
    for cause_key, probe in plan.deciding:
        if probe in transforms and probe != "baseline":
            by_probe.setdefault(probe, []).append(cause_key)
    against = (after.failures, after.n)
    payloads = []
    for probe, cause_keys in by_probe.items():
        result = replay(
            stack,
            [transforms[probe](body) for body in bodies],
            max_requests=max_requests,
            baseline=against,
            log_dir=run_dir / probe if run_dir else None,
        )
        payload = _arm_run(
            result,
            f"{REVISIT_ARM}:{probe}",
            f"deciding probe of {', '.join(cause_keys)} on the current stack",
            against,
        )
        payload.causes = cause_keys
        payloads.append((probe, payload))
    return payloads


def _record(
    store: Store,
    slug: str,
    source: str,
    after: _ArmRun,
    summary: str,
    probes: list[tuple[str, _ArmRun]],
    at: datetime,
) -> list[str]:
    """Store the revisit run and its probes as evidence, in one transaction; their keys."""
    keys: list[str] = []
    with store.session() as session:
        incident = require_incident(session, slug)
        assert incident.id is not None

        def add(text: str, run: _ArmRun) -> str:
            return add_evidence(
                session,
                incident_id=incident.id,
                kind="measurement",
                summary=text,
                payload=run.payload(),
                source=f"triage revisit --stack {source}",
                recorded_at=at,
            ).key

        keys.append(add(summary, after))
        against = ArmCounts((keys[0],), after.failures, after.n)
        for probe, payload in probes:
            line = _summary_line(f"revisit probe {probe} on the current stack", payload, against)
            keys.append(add(line, payload))
    return keys


def _proposal(
    slug: str,
    status: str,
    baseline: ArmCounts | None,
    after: _ArmRun,
    key: str,
) -> tuple[str, str]:
    """(proposal, message) from the before/after rates and the incident's status."""
    decision = after.decision
    rates = f"before {_rate(baseline.failures, baseline.n)}" if baseline else "no baseline"
    rates += f", after {_rate(after.failures, after.n)}"
    if after.p_value is not None:
        rates += f", p={float(after.p_value):.2g}"
    if decision == "errored":
        return "none", f"revisit errored: {after.error or 'the server failed'} [{key}]"
    if status == "fixed":
        if decision == "removes":
            return "FIXED-holds", f"the fix holds ({rates}) [{key}]"
        if after.failures:
            return "REOPENED", (
                f"the failure is back ({rates}) [{key}]; record it with: triage decide "
                f'{slug} --reopened --why "failure back on the current stack" --evidence {key}'
            )
        return "FIXED-holds", f"no failure replayed ({rates}) [{key}]"
    stays = "PARKED" if status == "parked" else "none"
    if baseline is None:
        return stays, (
            f"no baseline failure rate on record, so no fix can be shown ({rates}) "
            f"[{key}]; measure one with `triage diagnose`"
        )
    if decision == "removes":
        return "FIXED", (
            f"propose FIXED: the failure is gone on the current stack ({rates}) [{key}]; "
            f'record it with: triage decide {slug} --fixed --fix "WHAT CHANGED" --evidence {key}'
        )
    verdict = "unchanged" if decision == "unchanged" else f"not decided ({decision})"
    message = f"the failure is {verdict} on the current stack ({rates}) [{key}]"
    return stays, ("stays PARKED: " + message) if status == "parked" else message


def revisit_incident(
    store: Store,
    slug: str,
    stack_path: Path | None = None,
    *,
    max_requests: int = 32,
    log_dir: Path | None = None,
    replay_rate: ReplayRate | Callable[..., Any] | None = None,
    at: datetime | None = None,
) -> RevisitResult:
    """Replay an incident's recorded failing exchanges (and, while the failure is still
    there, the deciding probes of its confirmed and suspected causes) on the current stack;
    record the results as evidence; propose FIXED, PARKED or REOPENED.

    Raises DecisionError (nothing to revisit), StackError (bad stack file) or EngineError.
    """
    replay = replay_rate or engine_replay_rate
    plan = _plan(store, slug, stack_path)
    stack = load_stack(plan.source)
    facts = _stack_facts(stack)
    bodies = [body for _, body in plan.requests]
    baseline = plan.baseline
    base_pair = (baseline.failures, baseline.n) if baseline else None
    run_dir = log_dir / slug if log_dir else None
    result = replay(stack, bodies, max_requests=max_requests, baseline=base_pair, log_dir=run_dir)
    after = _arm_run(
        result,
        REVISIT_ARM,
        "recorded failing exchanges replayed on the current stack",
        base_pair,
    )
    after.stack = facts
    after.requests = [key for key, _ in plan.requests]
    if baseline is not None:
        after.baseline_evidence = list(baseline.evidence_keys)
    build = facts.get("build_number")
    build_text = f" (build b{build})" if build else ""
    summary = _summary_line(f"revisit on the current stack{build_text}", after, baseline)
    probes = _probe_payloads(
        replay, stack, bodies, plan, after, max_requests=max_requests, run_dir=run_dir
    )
    keys = _record(store, slug, plan.source, after, summary, probes, at or utcnow())
    proposal, message = _proposal(slug, plan.status, baseline, after, keys[0])
    for probe, payload in probes:
        message += (
            f"; deciding probe {probe}: {_rate(payload.failures, payload.n)} ({payload.decision})"
        )
    if after.error and after.decision != "errored":
        # Some replies came back before the server failed; the rates above count only those.
        message += f"; the server failed part-way: {after.error}"
    return RevisitResult(
        slug=slug,
        status=plan.status,
        proposal=proposal,
        message=message,
        evidence=keys,
        before=(
            Rate(baseline.failures, baseline.n, evidence=tuple(baseline.evidence_keys))
            if baseline
            else None
        ),
        after=Rate(
            after.failures,
            after.n,
            after.rate,
            after.ci95,
            after.p_value,
            after.decision,
        ),
        probes=[
            ProbeOutcome(name, p.failures, p.n, p.decision, tuple(p.causes or ()))
            for name, p in probes
        ],
        errored=after.decision == "errored",
    )
