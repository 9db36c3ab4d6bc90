"""The sequential scheduler: looks, stopping and moot arms. Pure.

No I/O, no knowledge base, no arm names: replies come from a `Replayer` (the llama client
in production, a fake in unit tests); what an arm may decide comes from its declared
causes and a `judge` (the cause rules). The looks are pipelined (`_Pipeline`): each arm
goes through the schedule (4, 8, 16, ... replays) at its own pace -- topped up to the
look's size with paired seeds (replay `i` of every arm uses seed `base + i`), then compared
with the baseline's replays of the same indices (group-sequential test, stats.compare) --
and

- stops when decided (removes / unchanged / no-baseline-failure);
- stops when moot: none of its possible outcomes (removes, unchanged, undecided) would
  change the verdict of any cause it decides, given the other arms so far;
- otherwise goes on to its next look, up to the cap.

The baseline is topped up as far as the furthest arm needs. An arm whose server is still
starting joins the run when it is up (`joining`). An arm whose replayer raises `ArmFailed`
(its server died) is errored together with every arm sharing its server (`group`); if that
is the baseline's server, the run stops.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
    "no_replies",
    "paired",
]

DECIDED = ("removes", "unchanged", "no-baseline-failure")
OPEN = ("not-run", "undecided")


class ReplyLike(Protocol):
    """What the scheduler reads of a reply (kb.domain.records.Reply is one)."""

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
            ended_tokens=tuple(_ended_tokens(self.replies)),
            elapsed=tuple(_elapsed(r) for r in self.replies if not r.error),
            failure_elapsed=tuple(_elapsed(r) for r in self.replies if not r.error and r.failed),
        )

    def has(self, index: int) -> bool:
        return any(r.index == index for r in self.replies)


def _ended_tokens(replies: Sequence[Any]) -> list[int]:
    """Completion tokens of the replies that ended on their own (finish_reason "stop")."""
    out = []
    for reply in replies:
        tokens = (getattr(reply, "timings", None) or {}).get("predicted_n")
        if getattr(reply, "finish_reason", None) == "stop" and not reply.error:
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                out.append(tokens)
    return out


def _elapsed(reply: Any) -> float:
    return float(getattr(reply, "elapsed_s", 0.0) or 0.0)


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
        self,
        arms: dict[str, ArmState],
        names: Sequence[str],
        replayer: Replayer,
        joining: Mapping[str, Awaitable[bool]] | None = None,
    ) -> None:
        """Bring `names` (besides the baseline) to a decision; `arms` holds every arm of the
        run (the baseline included), so verdicts and mootness see all of them.

        `joining` maps arms (of `names`) whose server is still starting to an awaitable
        that is True once they can replay (False: the caller errored them)."""
        try:
            await _Pipeline(self, arms, replayer).run(names, joining or {})
        finally:
            await _close(replayer)

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
        await self._replay(replayer, arm, todo)

    async def _replay(self, replayer: Replayer, arm: ArmState, indices: list[int]) -> None:
        """Replay `indices` of the arm; its replies kept and stored (on_replies)."""
        replies = list(await replayer.replay(arm.name, indices))
        arm.replies.extend(replies)
        self.on_replies(replies)

    def moot(
        self,
        arms: Mapping[str, ArmState],
        name: str,
        seen_as: Mapping[str, ArmOutcome] | None = None,
    ) -> str | None:
        """Why more replays of this arm cannot change any verdict (None: they can).

        An arm that decides no cause is informational: never moot. Otherwise the judge is
        asked what every cause the arm decides would be if the arm removed the failure, left
        it unchanged or stayed undecided; when all three agree, the arm is moot. Only once
        the baseline has as many failures as the rule needs to decide any arm
        (stats.min_deciding_failures: 3). `seen_as` replaces the outcomes of some arms (what
        lock-step looks would have shown of them at this point)."""
        arm = arms[name]
        if self.judge is None or not arm.decides:
            return None
        outcomes = {n: a.outcome() for n, a in arms.items()}
        outcomes.update(seen_as or {})
        outcomes[name] = arms[name].outcome()
        if outcomes[BASELINE].failures < min_deciding_failures():
            return None
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


RANK = {"request": 0}  # server-level arms (and any other level) rank 1: see _Pipeline


def _rank(arm: ArmState) -> int:
    return RANK.get(arm.level, 1)


def _upto(arm: ArmState, target: int) -> ArmState:
    """The arm's replies of indices below `target`: what a look of that size compares."""
    return replace(arm, replies=[r for r in arm.replies if r.index < target])


class _Pipeline:
    """One scheduler run with pipelined looks: every arm is a task of its own that goes
    through the look schedule at its own pace -- top up to look k, wait until the baseline
    has look k, decide, go on -- so no arm waits for another arm's slow replies. The
    baseline is topped up as far as the furthest arm needs, its replays asked for before
    the arm's own. Look k compares the arm's and the baseline's replays of indices below
    `schedule[k]` (seed-paired), whatever else the baseline has by then: the same
    comparisons, hence the same decisions and error guarantees, as lock-step looks.

    Mootness needs the other arms' outcomes, and must not see more than lock-step looks
    showed (an arm stopped as moot earlier than before would not show its own decision):
    an undecided arm's moot check at look k sees the arms of its run as lock-step looks
    did -- those before it in the run's order decided at look k, those after it with their
    look-k replies and look k-1's decision, server-level arms (which used to run after the
    request-level ones) not run yet from a request-level arm, request-level arms finished
    from a server-level arm -- and waits for the arms sharing a cause with it (`decides`)
    until they got that far.
    """

    def __init__(self, scheduler: Scheduler, arms: dict[str, ArmState], replayer: Replayer):
        self.scheduler = scheduler
        self.arms = arms
        self.replayer = replayer
        self.baseline = arms[BASELINE]
        self.running: set[str] = set()
        self.order: dict[str, int] = {}  # the run's arms in their given order
        self.history: dict[str, list[ArmOutcome]] = {}  # arm -> its outcome after each look
        self.topped: dict[str, int] = {}  # arm -> its last look whose replays are all in
        self.changed = asyncio.Condition()
        self.base_tasks: list[tuple[int, asyncio.Future[None]]] = []  # (lowest index, task)
        self.base_asked: set[int] = set()
        self.announced = -1
        self.stopped = False  # the baseline's server failed

    async def run(self, names: Sequence[str], joining: Mapping[str, Awaitable[bool]]) -> None:
        names = [
            n
            for n in names
            if n != BASELINE and self.arms[n].decision in OPEN and not self.arms[n].error
        ]
        for name, ready in joining.items():  # not run: its readiness is not awaited
            if name not in names and inspect.iscoroutine(ready):
                ready.close()
        self.running = set(names)
        self.order = {name: i for i, name in enumerate(names)}
        tasks = [asyncio.ensure_future(self._arm(n, joining.get(n))) for n in names]
        try:
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *(t for _, t in self.base_tasks)]:
                task.cancel()
            await asyncio.gather(*tasks, *(t for _, t in self.base_tasks), return_exceptions=True)

    async def _arm(self, name: str, ready: Awaitable[bool] | None) -> None:
        arm = self.arms[name]
        try:
            if ready is not None and not await ready:
                return
            for look, target in enumerate(self.scheduler.schedule):
                if self.stopped or arm.error:
                    break
                self._announce(look, target)
                base = self._baseline_at(target)
                await asyncio.sleep(0)  # the baseline's replays are asked for first
                try:
                    await self.scheduler._top_up(self.replayer, arm, target)
                except ArmFailed as failure:
                    self._failed(arm.group, failure)
                no_replies(arm)
                async with self.changed:
                    self.topped[name] = look
                    self.changed.notify_all()
                await _all(base)
                if self.stopped or arm.error:
                    break
                if await self._decide(name, look, target):
                    return
        finally:
            if self.stopped and not arm.error and arm.decision in OPEN:
                arm.decision = "undecided"  # never decided against a dead baseline
                arm.stopped = "baseline server failed"
            await self._finished(name)

    async def _decide(self, name: str, look: int, target: int) -> bool:
        """Compare look `look`; True when the arm stops (decided or moot)."""
        arm = self.arms[name]
        base, mine = _upto(self.baseline, target), _upto(arm, target)
        cmp = compare(
            base.failures,
            base.n,
            mine.failures,
            mine.n,
            looks=len(self.scheduler.schedule),
            paired=paired(base, mine),
        )
        arm.p_less, arm.p_value = cmp.p_less, cmp.p_two_sided
        arm.decision = cmp.decision
        async with self.changed:
            self.history.setdefault(name, []).append(arm.outcome())
            self.changed.notify_all()
        if cmp.decision in DECIDED:
            arm.stopped = f"decided at look {look + 1} (n={arm.n})"
            return True
        why = None
        if self.scheduler.judge is not None and arm.decides:
            async with self.changed:
                await self.changed.wait_for(lambda: self.stopped or not self._peers(name, look))
            why = self.scheduler.moot(self.arms, name, self._seen_as(name, look))
        if why is not None:
            arm.stopped = f"stopped at n={arm.n}: not needed, {why}"
            return True
        arm.stopped = f"cap of {self.scheduler.cap} reached"
        return False

    def _behind(self, name: str, other: str, look: int) -> bool:
        """Has the same-rank arm `other` not yet got as far as lock-step looks showed it to
        `name` at `look`? Arms before it in the run's order were decided at that look
        already; arms after it had that look's replies, with the decision of the look
        before. A finished arm is as far as it goes."""
        if other not in self.running:
            return False
        if self.order[other] < self.order[name]:
            return len(self.history.get(other, [])) <= look
        return self.topped.get(other, -1) < look

    def _peers(self, name: str, look: int) -> list[str]:
        """Running arms sharing a cause with `name` whose news its moot check waits for: of
        a lower rank until finished, of the same rank until not `_behind`."""
        arm = self.arms[name]
        out = []
        for other in self.running:
            peer = self.arms[other]
            if other == name or not set(peer.decides) & set(arm.decides):
                continue
            if _rank(peer) < _rank(arm) or (
                _rank(peer) == _rank(arm) and self._behind(name, other, look)
            ):
                out.append(other)
        return out

    def _seen_as(self, name: str, look: int) -> dict[str, ArmOutcome]:
        """The other arms of this run as lock-step looks showed them to `name` at `look`:
        the baseline at the look's size (all of it, to a server-level arm); arms of the same
        rank as `_behind` says (as far as they got); arms of a higher rank (server-level
        arms, once run after the request-level ones) not run yet."""
        arm = self.arms[name]
        target = self.scheduler.schedule[look]
        # Request-level arms' looks saw the baseline at the look's size; server-level arms
        # (run after them) saw all of it.
        base = _upto(self.baseline, target) if _rank(arm) == 0 else self.baseline
        seen = {BASELINE: base.outcome()}
        for other in self.order:
            peer = self.arms[other]
            if other == name or peer.error or _rank(peer) < _rank(arm):
                continue
            history = self.history.get(other, [])
            if _rank(peer) > _rank(arm):
                seen[other] = ArmState(other, peer.variant, peer.level, peer.group).outcome()
            elif self.order[other] < self.order[name] or len(history) < look:
                # decided at this look, or finished before it (or not started: as it is)
                seen[other] = history[min(look, len(history) - 1)] if history else peer.outcome()
            else:  # this look's replies, the decision of the look before
                before = history[look - 1] if look > 0 else None
                seen[other] = replace(
                    _upto(peer, target).outcome(),
                    decision=before.decision if before else "not-run",
                    p_value=before.p_value if before else None,
                )
        return seen

    async def _finished(self, name: str) -> None:
        async with self.changed:
            self.running.discard(name)
            self.changed.notify_all()

    def _announce(self, look: int, target: int) -> None:
        if look > self.announced:
            self.announced = look
            self.scheduler.on_look(look, target, sorted(self.running))

    def _baseline_at(self, target: int) -> list[asyncio.Future[None]]:
        """Ask for the baseline's replays below `target` not asked for yet (a task started
        now); returns the tasks that bring every one of them in."""
        todo = [i for i in range(target) if i not in self.base_asked and not self.baseline.has(i)]
        if todo and not self.baseline.error:
            self.base_asked.update(todo)
            task = asyncio.ensure_future(self._baseline_replay(todo))
            self.base_tasks.append((todo[0], task))
        return [t for first, t in self.base_tasks if first < target]

    async def _baseline_replay(self, indices: list[int]) -> None:
        try:
            await self.scheduler._replay(self.replayer, self.baseline, indices)
        except ArmFailed as failure:
            self._failed(self.baseline.group, failure)

    def _failed(self, group: str, failure: ArmFailed) -> None:
        Scheduler._mark_failed(self.arms, group, failure)
        if self.baseline.error and not self.stopped:
            self.stopped = True
            asyncio.ensure_future(self._wake())

    async def _wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()


def no_replies(arm: ArmState) -> None:
    """An arm whose every replay so far ended without an answer (timeouts, slow replies
    given up, HTTP failures) stops, errored with the reason -- never left silently at 0/0
    (issue 28); `--resume` replays what errored."""
    if arm.error or not arm.replies or arm.n > 0:
        return
    first = next((r for r in arm.replies if "timeout" in r.kinds), arm.replies[0])
    arm.error = (
        f"no replies: {len(arm.replies)} of {len(arm.replies)} replays ended without an "
        f"answer ({first.error or ', '.join(first.kinds)})"
    )
    arm.decision = "errored"
    arm.stopped = "no replies"


async def _all(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Wait for every task (their errors are raised; cancelling this cancels none)."""
    if tasks:
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
