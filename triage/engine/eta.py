"""How long a run can still take, from measured replay times. Pure.

The bound is the replays still possible (every arm still open up to the cap, the baseline up
to the cap, each server-level arm not started yet up to the cap) times the measured time of
one replay on that server, divided by the replays it runs at once (its slots). Arms usually
decide sooner, so the run usually ends well before the bound; a server that slows down
(load, longer replies) can make it late, which is why the bound is recomputed whenever
replies come in. Until a replay has been timed there is no bound (None): an ETA from the
time of looks (4, 8, 16 ... replays each) promised "~0:41 left" and took 7 minutes
(issue 28).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from triage.causes import BASELINE
from triage.engine.scheduler import DECIDED, ArmState

__all__ = ["Eta", "eta_bound"]


@dataclass(frozen=True)
class Eta:
    """An upper bound on the time left, with what it was computed from."""

    seconds: float
    replays: int  # replays still possible at most
    per_replay: float  # measured mean seconds of one replay


def _finished(arm: ArmState) -> bool:
    return bool(arm.error) or arm.decision in DECIDED or arm.stopped.startswith("stopped at n=")


def eta_bound(
    arms: Iterable[ArmState],
    cap: int,
    slots: Mapping[str, int],
    pending_server_arms: int = 0,
    default_slots: int = 1,
) -> Eta | None:
    """The bound for `arms` (the run's arms, the baseline included) with at most `cap`
    replays each; `slots`: concurrent replays per server (arm group); `pending_server_arms`:
    server-level arms whose servers have not started (each up to the cap, on one slot, at
    the measured pace). None until some replay was timed."""
    arms = list(arms)
    timed = [r.elapsed_s for a in arms for r in a.replies if (r.elapsed_s or 0) > 0]
    if not timed:
        return None
    overall = sum(timed) / len(timed)
    per_group: dict[str, list[float]] = {}
    for arm in arms:
        per_group.setdefault(arm.group, []).extend(
            r.elapsed_s for r in arm.replies if (r.elapsed_s or 0) > 0
        )
    seconds = 0.0
    replays = 0
    open_arms = [a for a in arms if a.name != BASELINE and not _finished(a)]
    for arm in arms:
        left = max(0, cap - len(arm.replies))
        if arm.name == BASELINE and not open_arms and not pending_server_arms:
            continue  # the baseline replays only as far as other arms need
        if not left or (arm.name != BASELINE and _finished(arm)):
            continue
        measured = per_group.get(arm.group) or []
        per = sum(measured) / len(measured) if measured else overall
        seconds += left * per / max(1, slots.get(arm.group, default_slots))
        replays += left
    seconds += pending_server_arms * cap * overall / max(1, default_slots)
    replays += pending_server_arms * cap
    return Eta(seconds, replays, overall)
