"""Crash-only causes beside cpu-backend, each decided by its server arm when the incident's
server crashes or hangs (triage/engine/arms/crash_variants.py):

- warmup-decode: only the empty warm-up decode at startup crashes; with `--no-warmup` the
  server starts AND serves the request (a crash on the request still fails the replay);
- cpu-threads: a multi-threaded CPU kernel (a race between compute threads); with one
  thread the server starts and serves.

Built-in numbers 15 and 16, declared below (triage/plugin_api.py).
"""

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

CRASH_FACTS = ("startup-crash", "mid-request-crash", "server-hang")


def _crash(obs: Observations) -> tuple[str, ...]:
    return tuple(name for name in CRASH_FACTS if name in obs.facts)


def _rule(cause: str, arm_name: str, missing: str, removes_text: str, unchanged_text: str):  # type: ignore[no-untyped-def]
    def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
        base, arm = baseline_of(arms), arms.get(arm_name)
        gate = arm_gate(
            cause,
            arm,
            base,
            reproduces(arms),
            arm_name,
            available=arm_name in obs.planned,
            missing=missing,
            hint="a stack whose server crashes or hangs",
        )
        if gate is not None:
            return gate
        assert arm is not None
        return removal_verdict(
            cause,
            arm,
            base,
            removes_text=removes_text,
            unchanged_text=unchanged_text,
            supports=_crash(obs),
        )

    return rule


WARMUP = CauseRule(
    id="warmup-decode",
    number=15,
    title="The warm-up decode at startup",
    mechanism="the empty warm-up run llama-server does before serving crashes; real "
    "requests do not",
    decided_by="the no-warmup server arm when the server crashes or hangs",
    rule=_rule(
        "warmup-decode",
        "no-warmup",
        "the stack already sets the warm-up flag",
        "with --no-warmup the server starts and serves the request",
        "with --no-warmup the server still crashes (at startup or on the request)",
    ),
    retrospective="llama-server crashed in its warm-up decode; it ran with --no-warmup",
    when="crash",
)

THREADS = CauseRule(
    id="cpu-threads",
    number=16,
    title="A multi-threaded CPU kernel (thread race)",
    mechanism="compute threads race in a CPU kernel; one thread does not crash",
    decided_by="the one-thread server arm when the server crashes or hangs",
    rule=_rule(
        "cpu-threads",
        "one-thread",
        "the server already runs one compute thread",
        "with one compute thread (-t 1 -tb 1) the server starts and serves",
        "with one compute thread the server still crashes",
    ),
    retrospective="llama-server crashed with several compute threads; it ran with -t 1",
    when="crash",
)


def register(catalogue: object) -> None:
    catalogue.causes.add(WARMUP)  # type: ignore[attr-defined]
    catalogue.causes.add(THREADS)  # type: ignore[attr-defined]
