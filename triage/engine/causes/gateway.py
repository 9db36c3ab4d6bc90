"""gateway-timeout: a gateway in front of llama-server (LiteLLM, llama-swap, nginx, a vendor
router) gives up before the server has answered -- its read timeout is shorter than the
generation -- and the client gets the gateway's 502/504 page (or a LiteLLM timeout) while
llama-server is still generating.

Decided by the `gateway-direct` arm: the same request replayed direct to llama-server
(`[server].url`) instead of through the gateway (`[gateway].url`), against the baseline
through the gateway. Confirmed only when direct removes the failure and the baseline
reproduces it; rejected when direct fails the same way (the gateway only passes the
failure on). Two readings support it without deciding it: the fixed deadline (the failures
through the gateway all end at one elapsed time, whatever the request variant: that time is
the gateway's timeout) and `gateway-streamed` (streamed, headers and tokens arrive early).

Without a `[gateway]`, every replay goes straight to llama-server: a failure that reproduces
there needs no gateway, and the cause is rejected; one whose failing replies are a gateway's
own error pages means `[server].url` is a gateway -- untested, say how to test it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    not_reproduced,
    removal_verdict,
    removes,
    reproduces,
    share,
    suspect,
)
from triage.plugin_api import Registry

ID = "gateway-timeout"
DIRECT = "gateway-direct"
STREAMED = "gateway-streamed"
GATEWAY_KINDS = ("gateway-error", "timeout")
# Failures "end at one elapsed time" when all lie within this much of their median: a
# quarter second (scheduling jitter on a busy host) or 5% of the deadline, the larger.
MIN_TOLERANCE_S = 0.25
RELATIVE_TOLERANCE = 0.05
MIN_DEADLINE_FAILURES = 3
# Share of the failures that must end at the deadline (the rest may end later, never earlier).
MIN_ON_TIME_SHARE = 0.75


@dataclass(frozen=True)
class Deadline:
    """Failures through the gateway that end at one elapsed time (a few may end later)."""

    seconds: float  # the median elapsed time of the failures at the deadline
    spread: float  # the largest distance of one of those from it
    failures: int  # the failures at the deadline
    variants: tuple[str, ...]  # the arms (request variants) whose failures it covers
    longest_pass: float | None  # the longest reply that got through the gateway
    late: tuple[float, ...] = ()  # failures that ended later (queueing on a busy host)

    def text(self) -> str:
        passed = (
            f"; no reply through it took longer ({self.longest_pass:.1f} s at most)"
            if self.longest_pass is not None
            else ""
        )
        late = (
            f"; {len(self.late)} more ended later, at {min(self.late):.1f}-{max(self.late):.1f} s "
            "(a deadline is never early, but a busy gateway or server can answer late)"
            if self.late
            else ""
        )
        lead = (
            f"{self.failures} of {self.failures + len(self.late)} failures through the gateway end"
            if self.late
            else "every failure through the gateway ends"
        )
        return (
            f"{lead} at {self.seconds:.1f}+-{self.spread:.1f} s "
            f"({self.failures} failing replies of {len(self.variants)} request variant(s): "
            f"{', '.join(self.variants)}): the gateway's read timeout{late}{passed}"
        )


def _passes(arm: ArmOutcome) -> list[float]:
    left = Counter(arm.elapsed)
    left.subtract(Counter(arm.failure_elapsed))
    return [value for value, count in left.items() for _ in range(max(0, count))]


def fixed_deadline(
    arms: Mapping[str, ArmOutcome], exclude: tuple[str, ...] = ()
) -> Deadline | None:
    """The deadline the failures through the gateway cluster at, whatever the request
    variant; None when they do not cluster (or are too few, or not timeouts/gateway pages,
    or some reply got through after the would-be deadline)."""
    elapsed: list[float] = []
    passes: list[float] = []
    variants: list[str] = []
    for name, arm in arms.items():
        if name in exclude or not arm.ran:
            continue
        passes += _passes(arm)
        if arm.failures and arm.failure_elapsed and share(arm, *GATEWAY_KINDS) == 1.0:
            elapsed += list(arm.failure_elapsed)
            variants.append(name)
    if len(elapsed) < MIN_DEADLINE_FAILURES:
        return None
    # A deadline is a floor: no failure ends before it, and load only delays the answer. The
    # failures at the deadline are those within reach of the earliest one; they must be most
    # of them, and the few later ones are reported, not hidden.
    floor = min(elapsed)
    reach = max(MIN_TOLERANCE_S, RELATIVE_TOLERANCE * floor)
    on_time = [value for value in elapsed if value - floor <= reach]
    late = tuple(sorted(value for value in elapsed if value - floor > reach))
    if len(on_time) < MIN_DEADLINE_FAILURES or len(on_time) < MIN_ON_TIME_SHARE * len(elapsed):
        return None
    center = statistics.median(on_time)
    spread = max(abs(value - center) for value in on_time)
    tolerance = max(MIN_TOLERANCE_S, RELATIVE_TOLERANCE * center)
    longest = max(passes) if passes else None
    if longest is not None and longest > center + tolerance:
        return None  # a reply got through after the "deadline": not a fixed deadline
    return Deadline(center, spread, len(on_time), tuple(variants), longest, late)


def _notes(arms: Mapping[str, ArmOutcome]) -> tuple[str, tuple[str, ...]]:
    parts: list[str] = []
    # Streamed replies pass a read timeout by design: only non-streamed ones show it.
    deadline = fixed_deadline(arms, exclude=(DIRECT, STREAMED))
    if deadline is not None:
        parts.append(deadline.text())
    streamed = arms.get(STREAMED)
    supports: tuple[str, ...] = ()
    if streamed is not None and streamed.ran:
        if removes(streamed):
            parts.append(
                f"streamed through the gateway it passes ({streamed.kn()}): tokens sent early "
                "keep the gateway's read timeout from firing"
            )
            supports = (STREAMED,)
        else:
            parts.append(f"streamed through the gateway: {streamed.kn()}")
    return ("; " + "; ".join(parts) if parts else ""), supports


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, direct = baseline_of(arms), arms.get(DIRECT)
    if DIRECT not in obs.planned:
        if not reproduces(arms):
            return not_reproduced(ID, base, f"{DIRECT} (give the stack a [gateway])")
        if share(base, "gateway-error") > 0:
            return suspect(
                ID,
                f"{share(base, 'gateway-error'):.0%} of the failing replays are a gateway's "
                "own error page, but the stack has no [gateway]: $.server.url looks like "
                "the gateway, not llama-server",
                f"{DIRECT} (set [gateway].url to the gateway and [server].url to the "
                "llama-server behind it)",
                basis="untested",
            )
        return Verdict(
            ID,
            "rejected",
            f"the failure reproduces with no gateway in between: every replay went straight "
            f"to llama-server, baseline {base.kn()}",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    gate = arm_gate(
        ID,
        direct,
        base,
        reproduces(arms),
        DIRECT,
        available=True,
        missing="",
        hint="",
    )
    if gate is not None:
        return gate
    assert direct is not None
    note, supports = _notes(arms)
    return removal_verdict(
        ID,
        direct,
        base,
        removes_text="direct to llama-server the same request does not fail: the gateway in "
        "front of it makes it fail",
        unchanged_text="direct to llama-server it fails the same way: the gateway only "
        "passes the server's failure on",
        note=note,
        supports=supports,
    )


CAUSE = CauseRule(
    id=ID,
    number=18,
    title="A gateway in front of llama-server times out (or fails) before the server answers",
    mechanism="a gateway (nginx, LiteLLM, llama-swap, a vendor router) has a read timeout "
    "shorter than the generation: it answers 502/504 (or a LiteLLM timeout) while "
    "llama-server is still generating",
    decided_by="the gateway-direct arm (the same request direct to llama-server vs through "
    "the gateway); the fixed deadline and the streamed arm support it",
    rule=rule,
    retrospective="the gateway in front of llama-server gave up before the server had "
    "answered (its read timeout was shorter than the generation); direct to the server the "
    "same requests succeeded",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
