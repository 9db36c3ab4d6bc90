"""Step 1 of a diagnosis, pure: which arms replay, which are skipped (and why), which
causes are decided -- for a server that serves and for one that crashed (crash mode).

The catalogue's arms are planned once (`plan`); crash mode is the same plan arranged for a
crashed server (`Plan.for_crash`), never planned again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kb.domain.diagnosis import SkippedArm
from kb.jsontypes import JsonObject
from triage import probes
from triage.causes import BASELINE
from triage.engine.held_back import is_held_back
from triage.engine.scheduler import ArmState
from triage.stackfile import Stack

__all__ = ["Plan", "plan"]


@dataclass(frozen=True)
class Plan:
    """What one run replays and decides."""

    stack: Stack
    request: JsonObject
    every: tuple[probes.PlannedArm, ...]  # every arm the catalogue plans, baseline first
    not_planned: tuple[SkippedArm, ...]  # catalogue arms this stack and request do not plan
    all_causes: tuple[Any, ...]  # the catalogue's causes
    crashed: bool = False
    arms: dict[str, probes.PlannedArm] = field(default_factory=dict)  # the arms to replay
    observe_only: tuple[probes.PlannedArm, ...] = ()  # `when = "observe"`: a hook, no replays
    # Arms run only when nothing else explains the failure (request-field ablation).
    held_back: tuple[probes.PlannedArm, ...] = ()
    skipped: tuple[SkippedArm, ...] = ()
    # Dimensions where the failing and the known-good configuration differ.
    known_good: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def causes(self) -> list[Any]:
        """The causes this run decides: crash-only causes (`when = "crash"`) only when the
        incident's server crashed."""
        return [
            c for c in self.all_causes if getattr(c, "when", "always") != "crash" or self.crashed
        ]

    @property
    def server_arms(self) -> list[probes.PlannedArm]:
        return [p for p in self.arms.values() if p.level == "server"]

    @property
    def request_arms(self) -> list[probes.PlannedArm]:
        return [p for p in self.arms.values() if p.level == "request"]

    def for_crash(self) -> Plan:
        """The same arms arranged for a crashed server: crash-only arms join, request-level
        arms (a crashed server serves no request) are skipped; no known-good search."""
        return _arrange(
            self.stack, self.request, self.every, self.not_planned, self.all_causes, True
        )

    def states(self) -> dict[str, ArmState]:
        """A fresh scheduler state for each arm to replay."""
        incident_key = self.stack.server.key()
        out = {}
        for name, planned in self.arms.items():
            if planned.level == "request":
                key = incident_key
            else:
                assert planned.config is not None
                key = planned.config.key()
            out[name] = ArmState(name, planned.variant, planned.level, key, planned.decides)
        return out


def plan(stack: Stack, request: JsonObject, arms: Sequence[Any], causes: Sequence[Any]) -> Plan:
    """The plan for a server that serves, from the catalogue's `arms` and `causes`."""
    every = tuple(probes.plan_arms(stack, request, arms))
    not_planned = tuple(SkippedArm(a, why) for a, why in probes.skipped_arms(stack, request, arms))
    return _arrange(stack, request, every, not_planned, tuple(causes), False)


def _arrange(
    stack: Stack,
    request: JsonObject,
    every: tuple[probes.PlannedArm, ...],
    not_planned: tuple[SkippedArm, ...],
    causes: tuple[Any, ...],
    crashed: bool,
) -> Plan:
    chosen: dict[str, probes.PlannedArm] = {}
    observe_only: list[probes.PlannedArm] = []
    held_back: list[probes.PlannedArm] = []
    skipped = list(not_planned)
    for planned in every:
        if planned.when == "observe":
            if planned.observe is not None and not crashed:
                observe_only.append(planned)
            continue
        if is_held_back(planned):
            if not crashed:
                held_back.append(planned)
            continue
        if planned.name != BASELINE and (
            (planned.when == "crash" and not crashed) or (crashed and planned.level == "request")
        ):
            # crash-only arms need a crash; a crashed server serves no request
            why = (
                "runs only when the incident's server crashes"
                if planned.when == "crash"
                else "the incident's server crashed: it serves no request"
            )
            skipped.append(SkippedArm(planned.name, why))
            continue
        chosen[planned.name] = planned
    return Plan(
        stack,
        request,
        every,
        not_planned,
        causes,
        crashed=crashed,
        arms=chosen,
        observe_only=tuple(observe_only),
        held_back=tuple(held_back),
        skipped=tuple(skipped),
        known_good={} if crashed else probes.known_good_dimensions(stack),
    )
