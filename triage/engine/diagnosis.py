"""Diagnosis building: arm summaries, the stack summary, the overall verdict and the
Diagnosis record (kb.domain.diagnosis)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kb.domain.diagnosis import (
    Diagnosis,
    DiagnosisArm,
    DiagnosisCause,
    Finding,
    GraphSummary,
    Observation,
    OverallVerdict,
    Reproduction,
    RunCost,
    ServerSummary,
    SkippedArm,
    StackSummary,
    failed_kinds,
)
from kb.domain.records import ArmSummary
from kb.models import utcnow
from triage.causes import BASELINE, Verdict
from triage.engine.held_back import carrying_fields
from triage.engine.scheduler import ArmState
from triage.engine.servers import safe_describe
from triage.llama.model_lint import LINT_NEXT
from triage.stackfile import ServerConfig, Stack
from triage.stats import wilson

__all__ = [
    "UNEXPLAINED",
    "arm_summary",
    "build_diagnosis",
    "overall_verdict",
    "server_seconds",
    "stack_summary",
]

UNEXPLAINED = "unexplained"
NOT_REPRODUCED = "not-reproduced"
# What to try when nothing in the catalogue explains a reproduced failure (after the
# suspected causes' own deciding probes).
GENERIC_NEXT = (
    "vary the request one field at a time (sampling settings, penalties, stop, the system "
    "message) and replay it",
    "try other weights or another build ([alternates] model / binary in stack.toml)",
    "read the server log of the run for warnings about the model file or its template",
)


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def server_seconds(arm: ArmState) -> float:
    total = 0.0
    for reply in arm.replies:
        t = reply.timings
        total += float(t.get("prompt_ms", 0) or 0) + float(t.get("predicted_ms", 0) or 0)
    return total / 1000.0


def _speed(arm: ArmState) -> float | None:
    rates = [
        float(r.timings["predicted_per_second"])
        for r in arm.replies
        if isinstance(r.timings.get("predicted_per_second"), (int, float))
    ]
    return round(sum(rates) / len(rates), 2) if rates else None


def arm_summary(arm: ArmState) -> ArmSummary:
    """The arm as evidence: k/n, Wilson 95% interval, p vs baseline, decision, costs."""
    ci = wilson(arm.failures, arm.n)
    draft_n = sum(int(r.timings.get("draft_n", 0) or 0) for r in arm.replies)
    accepted = sum(int(r.timings.get("draft_n_accepted", 0) or 0) for r in arm.replies)
    is_base = arm.name == BASELINE
    return ArmSummary(
        arm=arm.name,
        variant=arm.variant,
        level=arm.level,
        n=arm.n,
        failures=arm.failures,
        rate=round(arm.failures / arm.n, 4) if arm.n else None,
        ci95=ci.as_list(),
        p_value=None if is_base else _round(arm.p_value),
        p_less=None if is_base else _round(arm.p_less),
        decision="baseline" if is_base else arm.outcome().decision,
        stopped=arm.stopped,
        errors=len([r for r in arm.replies if r.error]),
        error=arm.error,
        log_tail=arm.log_tail,
        kinds=arm.kind_counts(),
        speed_tok_s=_speed(arm),
        server_seconds=round(server_seconds(arm), 3),
        launch_seconds=round(arm.launch_seconds, 3),
        draft_n=draft_n,
        draft_n_accepted=accepted,
        draft_acceptance=round(accepted / draft_n, 4) if draft_n else None,
    )


def server_summary(config: ServerConfig) -> ServerSummary:
    """A server configuration as the diagnosis names it (secret flag values masked)."""
    described = safe_describe(config)
    return ServerSummary(
        described["binary"], described["model"], list(described["args"]), described["url"]
    )


def stack_summary(
    stack: Stack, speculative: bool, host_workaround: str | None = None
) -> StackSummary:
    return StackSummary(
        server=server_summary(stack.server),
        speculative=speculative,
        alternate_model=str(stack.alternate_model or "") or None,
        alternate_binary=str(stack.alternate_binary or "") or None,
        known_good=server_summary(stack.known_good) if stack.known_good else None,
        host_workaround=host_workaround,
    )


def overall_verdict(
    state: str,
    causes: Sequence[DiagnosisCause],
    arms: Sequence[DiagnosisArm],
    findings: Sequence[Finding] = (),
) -> OverallVerdict:
    """The run's overall verdict: `explained` (a cause confirmed), `unexplained` (the failure
    reproduced, the run finished, and no cause is confirmed: a verdict of its own, with what
    was ruled out and what to try next), or the run's state (not-reproduced, partial)."""
    confirmed = [c.id for c in causes if c.status == "confirmed"]
    if confirmed:
        return OverallVerdict("explained", "explained by: " + ", ".join(confirmed))
    if state != "done":
        return OverallVerdict(state, f"no verdict: the run is {state}")
    base = next((a for a in arms if a.name == BASELINE), None)
    if base is not None and base.n and not base.failures:
        # The replays never showed the captured failure (a stream, a gateway or a turn
        # sequence the baseline does not replay): nothing was reproduced, so nothing is
        # "unexplained" either.
        return OverallVerdict(
            NOT_REPRODUCED,
            f"NOT REPRODUCED: no baseline replay failed (0/{base.n}) and no "
            "observation confirmed a cause; the captured failure was not seen again",
        )
    seen = f" (baseline {base.failures}/{base.n} failing)" if base is not None and base.n else ""
    rejected = [
        f"{c.id} ({c.deciding_probe or 'baseline'})" for c in causes if c.status == "rejected"
    ]
    probes = [
        f"{c.id}: {c.deciding_probe}"
        for c in causes
        if c.status == "suspected" and c.deciding_probe
    ]
    fields = carrying_fields(arms)
    carried = "; removing one request field removes it: " + "; ".join(fields) if fields else ""
    return OverallVerdict(
        UNEXPLAINED,
        f"UNEXPLAINED: the failure reproduces{seen} and no cause in the catalogue "
        "is confirmed" + carried,
        request_fields=list(fields),
        ruled_out=(
            f"ruled out {len(rejected)}: " + ", ".join(rejected) if rejected else "ruled out none"
        ),
        next_probes=[*_lint_next(findings), *probes, *GENERIC_NEXT],
    )


def _lint_next(findings: Sequence[Finding]) -> list[str]:
    """The model-file lint findings that failed, as what to try first."""
    failed = set(failed_kinds(findings))
    return [text for kind, text in LINT_NEXT.items() if kind in failed]


def build_diagnosis(
    *,
    slug: str,
    run_id: int | None,
    findings: Sequence[Finding],
    stack: StackSummary,
    arms: Sequence[tuple[ArmSummary, str | None]],
    observations: Sequence[Observation],
    verdicts: Sequence[Verdict],
    changes: Mapping[str, Mapping[str, Any]],
    keys: Callable[[Sequence[str]], list[str]],
    errors: Sequence[str],
    graph: GraphSummary,
    cost: RunCost,
    exchange_evidence: str | None,
    skipped: Sequence[SkippedArm] = (),
    state: str,
    reproduction: Reproduction | None,
) -> Diagnosis:
    """The Diagnosis of a decided run. A cause that this run did not move (weaker evidence
    than what set it) is reported with its standing status and says so."""
    causes = []
    for verdict in verdicts:
        change = changes.get(verdict.cause, {})
        applied = change.get("applied", True)
        status = verdict.status if applied else str(change.get("status", verdict.status))
        rationale = (
            verdict.rationale
            if applied
            else (
                f"{change.get('rationale')} (kept: this run could not test it -- "
                f"{verdict.rationale})"
            )
        )
        causes.append(
            DiagnosisCause(
                id=verdict.cause,
                status=status,
                rationale=rationale,
                evidence=keys([*verdict.supports, *verdict.refutes]) if applied else [],
                deciding_probe=verdict.deciding_probe,
                previous_status=change.get("previous"),
                undecided=(verdict.undecided or None) if status == "suspected" else None,
            )
        )
    undecided = [
        f"{c.id}: {c.undecided}" for c in causes if c.status == "suspected" and c.undecided
    ]
    undecided += list(errors)
    summaries = [DiagnosisArm.from_summary(summary, key) for summary, key in arms]
    return Diagnosis(
        incident=slug,
        run_id=run_id,
        generated_at=utcnow().isoformat(),
        findings=list(findings),
        arms=summaries,
        causes=causes,
        graph=graph,
        exchange_evidence=exchange_evidence,
        stack=stack,
        observations=list(observations),
        undecided=undecided,
        cost=cost,
        state=state,
        reproduction=reproduction,
        skipped_arms=list(skipped),
        verdict=overall_verdict(state, causes, summaries, findings),
    )
