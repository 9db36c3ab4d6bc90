"""cpu-backend: a CPU kernel or the repacked-weights path crashes the server (e.g. the AMX
repack path of llama.cpp#20824). Decided, when the incident's server crashes at startup,
by the `no-repack` server arm."""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    removal_verdict,
    reproduces,
)

ID = "cpu-backend"
ARM = "no-repack"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    crash = obs.facts.get("startup-crash") or {}
    gate = arm_gate(
        ID,
        arm,
        base,
        reproduces(arms),
        ARM,
        available=ARM in obs.planned,
        missing="the server does not run on a CPU backend that repacks weights",
        hint="a stack whose server crashes at startup",
    )
    if gate is not None:
        return gate
    assert arm is not None
    where = ""
    if crash:
        where = f"; crash: {crash.get('signal')}"
        if crash.get("backtrace_symbol"):
            where += f" in {crash['backtrace_symbol']}"
        if crash.get("repack"):
            where += ", the server's system_info shows REPACK = 1"
        if crash.get("amx_lines"):
            where += ", AMX in use"
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text="without weight repacking (--no-repack) the server starts and serves",
        unchanged_text="without weight repacking the server still crashes",
        note=where,
        supports=("startup-crash",),
    )


CAUSE = CauseRule(
    id=ID,
    number=6,
    title="A CPU backend kernel / the repacked weight path",
    mechanism="the CPU backend's repacked weights path (e.g. AMX) crashes or corrupts the "
    "computation on this host",
    decided_by="the no-repack server arm when the server crashes at startup",
    rule=rule,
    retrospective="llama-server crashed on this host's CPU backend (repacked weights path); "
    "it ran with --no-repack",
    when="crash",  # only decided when the incident's server crashes at startup
)


def register(catalogue: object) -> None:
    catalogue.causes.add(CAUSE)  # type: ignore[attr-defined]
