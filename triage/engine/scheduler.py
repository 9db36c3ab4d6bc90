"""The sequential scheduler: looks, stopping and moot arms. Pure.

No I/O, no knowledge base, no arm names: replies come from a `Replayer` (the llama client
in production, a fake in unit tests); what an arm may decide comes from its declared
causes and a `judge` (the cause rules). At each look of the schedule (4, 8, 16, ... replays)
every active arm and the baseline are topped up to the look's size with paired seeds
(replay `i` of every arm uses seed `base + i`), then each arm is compared with the baseline
(group-sequential Fisher test, stats.compare) and

- stops when decided (removes / unchanged / no-baseline-failure);
- stops when moot: none of its possible outcomes (removes, unchanged, undecided) would
  change the verdict of any cause it decides, given the other arms so far;
- otherwise stays active until the cap.

An arm whose replayer raises `ArmFailed` (its server died) is errored together with every
arm sharing its server (`group`); if that is the baseline's server, the run stops.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from triage.causes import BASELINE, ArmOutcome
from triage.stats import compare, min_deciding_failures

__all__ = [
    "ArmFailed",
    "ArmState",
    "Judge",
    "Replayer",
    "ReplyLike",
    "Scheduler",
    "paired",
]

DECIDED = ("removes", "unchanged", "no-baseline-failure")
OPEN = ("not-run", "undecided")


class ReplyLike(Protocol):
    """What the scheduler reads of a reply (kb.records.Reply is one)."""

    index: int
    failed: bool
    error: str
    kinds: list[str]
    raw_misplaced: bool
    timings: dict[str, Any]


class Replayer(Protocol):
    """Sends replays. `replay(arm, indices)` returns one scored reply per index (replay `i`
    with seed `seed + i`), or raises `ArmFailed` when the arm's server is gone."""

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Any]: ...


class ArmFailed(Exception):
    """The server behind an arm died (or could not serve at all)."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.log_tail = log_tail


# cause id -> status, for the given arm outcomes (the cause rules with this run's facts).
Judge = Callable[[Mapping[str, ArmOutcome]], Mapping[str, str]]


@dataclass
class ArmState:
    """One arm's replies and where the scheduler left it."""

    name: str
    variant: str
    level: str  # request | server
    group: str  # arms sharing a server share a group (its launch key)
    decides: tuple[str, ...] = ()
    replies: list[Any] = field(default_factory=list)
    decision: str = "not-run"
    stopped: str = ""
    error: str = ""
    log_tail: str = ""
    launch_seconds: float = 0.0
    p_less: float | None = None
    p_value: float | None = None

    @property
    def n(self) -> int:
        return len([r for r in self.replies if not r.error])

    @property
    def failures(self) -> int:
        return len([r for r in self.replies if not r.error and r.failed])

    def kind_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for reply in self.replies:
            if reply.failed and not reply.error:
                counts.update(set(reply.kinds))
        return dict(counts)

    def outcome(self) -> ArmOutcome:
        return ArmOutcome(
            name=self.name,
            n=self.n,
            failures=self.failures,
            decision="errored" if self.error and self.n == 0 else self.decision,
            p_value=self.p_less,
            kind_counts=self.kind_counts(),
            raw_misplaced=sum(1 for r in self.replies if r.failed and r.raw_misplaced),
            error=self.error,
        )

    def has(self, index: int) -> bool:
        return any(r.index == index for r in self.replies)


def paired(baseline: ArmState, arm: ArmState) -> tuple[int, int]:
    """(baseline failures among seed-matched replays, how many of those the arm fixed)."""
    base = {r.index: r for r in baseline.replies if not r.error}
    pairs = [(base[r.index], r) for r in arm.replies if not r.error and r.index in base]
    failing = [(b, a) for b, a in pairs if b.failed]
    return len(failing), sum(1 for _, a in failing if not a.failed)


@dataclass
class Scheduler:
    """Runs looks over a set of arms until each is decided, moot, errored or capped."""

    schedule: list[int]
    cap: int
    judge: Judge | None = None
    on_replies: Callable[[list[Any]], None] = lambda replies: None
    on_look: Callable[[int, int, list[str]], None] = lambda look, target, active: None

    async def run(
        self, arms: dict[str, ArmState], names: Sequence[str], replayer: Replayer
    ) -> None:
        """Bring `names` (besides the baseline) to a decision; `arms` holds every arm of the
        run (the baseline included), so verdicts and mootness see all of them."""
        try:
            await self._run(arms, names, replayer)
        finally:
            await _close(replayer)

    async def _run(
        self, arms: dict[str, ArmState], names: Sequence[str], replayer: Replayer
    ) -> None:
        baseline = arms[BASELINE]
        active = [
            n for n in names if n != BASELINE and arms[n].decision in OPEN and not arms[n].error
        ]
        for look, target in enumerate(self.schedule):
            if not active:
                break
            self.on_look(look, target, active)
            states = [baseline, *[arms[n] for n in active]]
            results = await asyncio.gather(
                *[self._top_up(replayer, s, target) for s in states], return_exceptions=True
            )
            for state, result in zip(states, results, strict=True):
                if isinstance(result, ArmFailed):
                    self._mark_failed(arms, state.group, result)
                elif isinstance(result, BaseException):
                    raise result
            if baseline.error:
                for name in active:
                    if not arms[name].error:
                        arms[name].decision = "undecided"
                    arms[name].stopped = "baseline server failed"
                return
            active = self._decide_look(arms, active, look)

    async def baseline_look(
        self, arms: dict[str, ArmState], target: int, replayer: Replayer
    ) -> None:
        """Top up the baseline alone (the reproduction gate looks at it first)."""
        baseline = arms[BASELINE]
        try:
            await self._top_up(replayer, baseline, target)
        except ArmFailed as failure:
            self._mark_failed(arms, baseline.group, failure)
        finally:
            await _close(replayer)

    async def _top_up(self, replayer: Replayer, arm: ArmState, target: int) -> None:
        """Replay the arm up to `target` replies, stored as soon as they are in (one write
        per arm and look: an interrupted run keeps every arm's finished replies; batching a
        look's arms into one write saved nothing measurable)."""
        have = {r.index for r in arm.replies}
        todo = [i for i in range(target) if i not in have]
        if not todo or arm.error:
            return
        replies = list(await replayer.replay(arm.name, todo))
        arm.replies.extend(replies)
        self.on_replies(replies)

    def _decide_look(self, arms: dict[str, ArmState], active: list[str], look: int) -> list[str]:
        baseline = arms[BASELINE]
        still = []
        for name in active:
            arm = arms[name]
            if arm.error:
                continue
            cmp = compare(
                baseline.failures,
                baseline.n,
                arm.failures,
                arm.n,
                looks=len(self.schedule),
                paired=paired(baseline, arm),
            )
            arm.p_less, arm.p_value = cmp.p_less, cmp.p_two_sided
            arm.decision = cmp.decision
            if cmp.decision in DECIDED:
                arm.stopped = f"decided at look {look + 1} (n={arm.n})"
            elif (why := self.moot(arms, name)) is not None:
                arm.stopped = f"stopped at n={arm.n}: not needed, {why}"
            else:
                arm.stopped = f"cap of {self.cap} reached"
                still.append(name)
        return still

    def moot(self, arms: Mapping[str, ArmState], name: str) -> str | None:
        """Why more replays of this arm cannot change any verdict (None: they can).

        An arm that decides no cause is informational: never moot. Otherwise the judge is
        asked what every cause the arm decides would be if the arm removed the failure, left
        it unchanged or stayed undecided; when all three agree, the arm is moot. Only once
        the baseline has as many failures as the rule needs to decide any arm
        (stats.min_deciding_failures: 3)."""
        arm = arms[name]
        if self.judge is None or not arm.decides:
            return None
        if arms[BASELINE].failures < min_deciding_failures():
            return None
        outcomes = {n: a.outcome() for n, a in arms.items()}
        current = outcomes[name]
        seen: dict[str, set[str]] = {cause: set() for cause in arm.decides}
        size = max(current.n, 1)
        for hypothesis, failures in (
            ("removes", 0),
            ("unchanged", size),
            ("undecided", current.failures),
        ):
            trial = dict(outcomes)
            trial[name] = replace(
                current,
                decision=hypothesis,
                n=size,
                failures=failures,
                p_value=current.p_value if current.p_value is not None else 0.0,
            )
            statuses = self.judge(trial)
            for cause in arm.decides:
                seen[cause].add(statuses.get(cause, ""))
        if any(len(values) > 1 for values in seen.values()):
            return None
        settled = ", ".join(
            f"{cause} stays {next(iter(seen[cause])) or 'unknown'}" for cause in arm.decides
        )
        return f"no outcome of it changes a verdict ({settled})"

    @staticmethod
    def _mark_failed(arms: dict[str, ArmState], group: str, failure: ArmFailed) -> None:
        for arm in arms.values():
            if arm.group == group and not arm.error:
                arm.error = failure.message
                arm.log_tail = failure.log_tail
                arm.decision = "errored"
                arm.stopped = "server crashed"


async def _close(replayer: Replayer) -> None:
    """Close the replayer's connection pools, when it keeps any (`aclose`), in a task of its
    own: httpx closes connections under a shielded cancel scope, which can swallow the
    cancellation a Ctrl-C sends the run's task -- the run would then go on instead of being
    interrupted. A cancelled run stops waiting here at once; asyncio.run finishes the close."""
    close = getattr(replayer, "aclose", None)
    if close is not None:
        await asyncio.shield(asyncio.ensure_future(close()))
