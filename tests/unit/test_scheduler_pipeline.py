"""Pipelined looks (issue 15): every arm goes through the look schedule at its own pace.

Fakes only. The replies are scripted (replay i of an arm fails by a RNG seeded with the arm
and i) and arrive after scripted delays, so arms finish their looks in a scrambled order; the
decisions must be those of lock-step looks, computed here straight from stats.compare.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Sequence

import pytest

from kb.domain.records import Reply
from triage.causes import ArmOutcome
from triage.engine.scheduler import DECIDED, ArmFailed, ArmState, Scheduler, paired
from triage.stats import compare, look_schedule


def _failed(arm: str, index: int, rate: float) -> bool:
    return random.Random(f"{arm}/{index}").random() < rate


class DelayedReplayer:
    """Scripted failures; each reply takes a scripted time (`delays[arm](index)` seconds),
    replies of one call in flight together. Records every index sent and when."""

    def __init__(
        self,
        rates: dict[str, float],
        delay: dict[str, float] | None = None,
        *,
        crash: dict[str, int] | None = None,
        gates: dict[str, asyncio.Event] | None = None,
        jitter: int = 0,
    ) -> None:
        self.rates = rates
        self.delay = delay or {}
        self.crash = crash or {}
        self.gates = gates or {}
        self.jitter = jitter
        self.sent: dict[str, list[int]] = {}
        self.log: list[tuple[str, int]] = []

    async def _one(self, arm: str, index: int) -> Reply:
        wait = self.delay.get(arm, 0.0)
        if self.jitter:
            wait += random.Random(f"{self.jitter}/{arm}/{index}").random() * 0.004
        await asyncio.sleep(wait)
        if arm in self.gates:
            await self.gates[arm].wait()
        failed = _failed(arm, index, self.rates[arm])
        self.log.append((arm, index))
        return Reply(
            arm,
            index,
            1000 + index,
            failed,
            ["length-stop"] if failed else [],
            "length" if failed else "stop",
            0,
            0,
            200,
            0.01,
            {},
        )

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        sent = self.sent.setdefault(arm, [])
        if arm in self.crash and len(sent) + len(indices) > self.crash[arm]:
            raise ArmFailed(f"server of {arm} died (exit code -11)", "Segmentation fault")
        sent.extend(indices)
        return list(await asyncio.gather(*[self._one(arm, i) for i in indices]))


def _arms(*specs: tuple[str, str, tuple[str, ...]], level: str = "request") -> dict[str, ArmState]:
    arms = {"baseline": ArmState("baseline", "as sent", "request", "g1")}
    for name, group, decides in specs:
        arms[name] = ArmState(name, name, level, group, decides)
    return arms


def _lockstep(rates: dict[str, float], schedule: list[int]) -> dict[str, tuple[str, int]]:
    """Each arm's (decision, n) under lock-step looks, straight from stats.compare."""
    out = {}
    for arm in rates:
        if arm == "baseline":
            continue
        decision, n = "undecided", schedule[-1]
        for target in schedule:
            base = ArmState("baseline", "", "request", "g")
            mine = ArmState(arm, "", "request", "g")
            for i in range(target):
                for state, name in ((base, "baseline"), (mine, arm)):
                    failed = _failed(name, i, rates[name])
                    state.replies.append(
                        Reply(name, i, 1000 + i, failed, [], "", 0, 0, 200, 0.0, {})
                    )
            cmp = compare(
                base.failures,
                base.n,
                mine.failures,
                mine.n,
                looks=len(schedule),
                paired=paired(base, mine),
            )
            if cmp.decision in DECIDED:
                decision, n = cmp.decision, target
                break
        out[arm] = (decision, n)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_decisions_are_those_of_lockstep_looks_whatever_order_replies_arrive(seed: int) -> None:
    rng = random.Random(seed)
    rates = {"baseline": rng.choice([1.0, 0.6, 0.35])}
    delay = {}
    for i in range(5):
        rates[f"arm{i}"] = rng.choice([0.0, 0.1, 0.3, rates["baseline"]])
        delay[f"arm{i}"] = rng.choice([0.0, 0.001, 0.003])
    schedule = look_schedule(32)
    arms = _arms(*[(name, "g1", ("c",)) for name in rates if name != "baseline"])
    replayer = DelayedReplayer(rates, delay, jitter=seed + 1)
    asyncio.run(Scheduler(schedule, 32).run(arms, list(arms), replayer))
    expected = _lockstep(rates, schedule)
    assert {n: (a.decision, a.n) for n, a in arms.items() if n != "baseline"} == expected
    # No replay beyond what each arm's own looks needed, the baseline only as far as the
    # furthest arm's last look; every index once.
    for name, (_, n) in expected.items():
        assert sorted(replayer.sent[name]) == list(range(n))
    assert sorted(replayer.sent["baseline"]) == list(range(max(n for _, n in expected.values())))


def test_an_arm_never_waits_for_another_arms_slow_replies() -> None:
    async def scenario() -> tuple[dict[str, ArmState], DelayedReplayer]:
        slow = asyncio.Event()
        arms = _arms(("fast", "g1", ("c",)), ("slow", "g1", ("d",)))
        replayer = DelayedReplayer(
            {"baseline": 1.0, "fast": 0.0, "slow": 1.0}, gates={"slow": slow}
        )
        run = asyncio.ensure_future(
            Scheduler(look_schedule(64), 64).run(arms, list(arms), replayer)
        )
        # Lock-step looks would hold "fast" at its first look until "slow" answers.
        for _ in range(500):
            if arms["fast"].decision == "removes":
                break
            await asyncio.sleep(0.01)
        assert arms["fast"].decision == "removes" and arms["fast"].n == 8
        assert arms["slow"].n == 0 and not any(arm == "slow" for arm, _ in replayer.log)
        assert replayer.sent["baseline"] == list(range(8))  # the baseline went on with fast
        slow.set()
        await asyncio.wait_for(run, 5.0)
        return arms, replayer

    arms, replayer = asyncio.run(scenario())
    assert arms["slow"].decision == "unchanged" and arms["slow"].n == 4
    assert sorted(replayer.sent["baseline"]) == list(range(8))


def test_the_baseline_replays_are_asked_for_before_the_arms_own() -> None:
    arms = _arms(("a", "g1", ("c",)), ("b", "g1", ("c",)))
    replayer = DelayedReplayer({"baseline": 1.0, "a": 0.0, "b": 0.0})
    asyncio.run(Scheduler([4, 8], 8).run(arms, list(arms), replayer))
    calls = [arm for arm, _ in replayer.log]
    # At each look the baseline's replays are sent first (they are needed by every arm).
    assert calls[:4] == ["baseline"] * 4
    assert calls[12:16] == ["baseline"] * 4


def _judge(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
    """Cause c is confirmed once arm a or arm srv removes the failure."""
    removed = any(outcomes[n].decision == "removes" for n in ("a", "srv") if n in outcomes)
    return {"c": "confirmed" if removed else "suspected"}


def test_a_server_arm_waits_for_the_request_arms_of_its_causes_before_another_look() -> None:
    arms = _arms(("a", "g1", ("c",)))
    arms["srv"] = ArmState("srv", "srv", "server", "g2", ("c",))
    # a (slow replies) removes the failure at its second look; srv fixes one failure in five
    # and, run after the request arms as server arms used to be, stopped at its first look.
    replayer = DelayedReplayer({"baseline": 1.0, "a": 0.0, "srv": 0.8}, {"a": 0.02})
    asyncio.run(Scheduler(look_schedule(64), 64, judge=_judge).run(arms, list(arms), replayer))
    assert arms["a"].decision == "removes" and arms["a"].n == 8
    assert arms["srv"].n == 4 and "c stays confirmed" in arms["srv"].stopped
    assert sorted(replayer.sent["srv"]) == [0, 1, 2, 3]


def test_an_arm_joins_when_its_server_is_ready_and_one_that_failed_to_start_does_not() -> None:
    async def scenario() -> tuple[dict[str, ArmState], DelayedReplayer]:
        arms = _arms(("fix", "g1", ("c",)))
        arms["late"] = ArmState("late", "late", "server", "g2", ("d",))
        arms["dead"] = ArmState("dead", "dead", "server", "g3", ("e",))
        replayer = DelayedReplayer({"baseline": 1.0, "fix": 0.0, "late": 0.0, "dead": 0.0})

        async def started(after: float, ok: bool) -> bool:
            await asyncio.sleep(after)
            if not ok:
                arms["dead"].error, arms["dead"].decision = "did not start", "errored"
            return ok

        joining: dict[str, Awaitable[bool]] = {
            "late": started(0.05, True),
            "dead": started(0.0, False),
        }
        await Scheduler(look_schedule(64), 64).run(arms, list(arms), replayer, joining)
        return arms, replayer

    arms, replayer = asyncio.run(scenario())
    assert arms["fix"].decision == "removes" and arms["late"].decision == "removes"
    assert sorted(replayer.sent["late"]) == list(range(8))  # its own looks, from the first
    assert "dead" not in replayer.sent and arms["dead"].decision == "errored"
    assert sorted(replayer.sent["baseline"]) == list(range(8))


def test_a_baseline_that_fails_stops_an_arm_still_waiting_for_its_server() -> None:
    async def scenario() -> dict[str, ArmState]:
        arms = _arms(("fix", "g2", ("c",)))
        arms["late"] = ArmState("late", "late", "server", "g3", ("d",))
        replayer = DelayedReplayer(
            {"baseline": 1.0, "fix": 0.3, "late": 0.0}, crash={"baseline": 4}
        )

        async def started() -> bool:
            await asyncio.sleep(0.05)
            return True

        await Scheduler(look_schedule(64), 64).run(arms, list(arms), replayer, {"late": started()})
        assert "late" not in replayer.sent  # nothing replays against a dead baseline
        return arms

    arms = asyncio.run(scenario())
    assert arms["baseline"].decision == "errored"
    for name in ("fix", "late"):
        assert arms[name].decision == "undecided"
        assert arms[name].stopped == "baseline server failed"


def test_server_slots_go_to_waiting_baseline_replays_first_and_survive_cancels() -> None:
    from triage.engine.replayer import Slots

    async def scenario() -> list[str]:
        slots = Slots(2)
        order: list[str] = []
        release = asyncio.Event()

        async def request(arm: str, tag: str) -> None:
            async with slots.take(arm):
                order.append(tag)
                await release.wait()

        busy = [asyncio.ensure_future(request("a", f"busy{i}")) for i in range(2)]
        await asyncio.sleep(0)
        queued = [
            asyncio.ensure_future(request(arm, tag))
            for arm, tag in (("a", "a1"), ("b", "b1"), ("baseline", "base1"), ("a", "a2"))
        ]
        await asyncio.sleep(0)
        queued[1].cancel()  # b1 gives up waiting: its place is not lost to the others
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*busy, *queued, return_exceptions=True)
        assert slots.free == 2 and not slots.waiting
        return order

    order = asyncio.run(scenario())
    assert order == ["busy0", "busy1", "base1", "a1", "a2"]


def _judge_unchanged(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
    """Cause c is rejected once arm u leaves the failure unchanged, whatever arm x shows;
    before that, confirmed when x removes it."""
    if outcomes["u"].decision == "unchanged":
        return {"c": "rejected"}
    return {"c": "confirmed" if outcomes["x"].decision == "removes" else "suspected"}


@pytest.mark.parametrize("slow", ["x", "u"])
def test_moot_checks_see_the_other_arms_as_lockstep_looks_did(slow: str) -> None:
    # x comes first in the run: at its first look, lock-step looks showed it u before u's
    # first decision, so x went on and decided at its second look -- whichever arm is
    # faster now. u, after x, saw x's first look: undecided, so u is decided, not moot.
    arms = _arms(("x", "g1", ("c",)), ("u", "g1", ("c",)))
    replayer = DelayedReplayer({"baseline": 1.0, "x": 0.0, "u": 1.0}, {slow: 0.01})
    scheduler = Scheduler(look_schedule(64), 64, judge=_judge_unchanged)
    asyncio.run(scheduler.run(arms, ["x", "u"], replayer))
    assert (arms["x"].decision, arms["x"].n) == ("removes", 8)
    assert (arms["u"].decision, arms["u"].n) == ("unchanged", 4)
    assert sorted(replayer.sent["baseline"]) == list(range(8))


def test_a_server_arm_sees_the_whole_baseline_the_request_arms_left() -> None:
    # The baseline fails on seeds 1, 5, 6 and 7 only: its first look holds one failure, too
    # few for any verdict, but u (request-level, failing on the same seeds) is "unchanged"
    # at n=8, which settles c. srv, once run after u, then saw 8 baseline replies and
    # stopped at its first look; it still does.
    class _Seeds(DelayedReplayer):
        async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
            replies = await super().replay(arm, indices)
            for reply in replies:
                reply.failed = arm in ("baseline", "u") and reply.index in (1, 5, 6, 7)
                reply.kinds = ["length-stop"] if reply.failed else []
            return replies

    def judge(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
        if outcomes["u"].decision == "unchanged":
            return {"c": "rejected"}
        return {"c": "confirmed" if outcomes["srv"].decision == "removes" else "suspected"}

    arms = _arms(("u", "g1", ("c",)))
    arms["srv"] = ArmState("srv", "srv", "server", "g2", ("c",))
    replayer = _Seeds({"baseline": 0.0, "u": 0.0, "srv": 0.0}, {"u": 0.01})
    asyncio.run(Scheduler(look_schedule(64), 64, judge=judge).run(arms, ["u", "srv"], replayer))
    assert (arms["u"].decision, arms["u"].n) == ("unchanged", 8)
    assert arms["srv"].n == 4 and "c stays rejected" in arms["srv"].stopped


@pytest.mark.parametrize("slow", ["x", "y"])
def test_a_later_arm_is_seen_with_its_replies_of_the_same_look(slow: str) -> None:
    # c can only be tested once y has replies; then x or y removing the failure confirms it.
    # Lock-step looks showed x, at its first look, y's first four replies (not yet decided):
    # x mattered, went on and decided.
    def judge(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
        if outcomes["y"].n == 0:
            return {"c": "suspected"}
        removed = "removes" in (outcomes["x"].decision, outcomes["y"].decision)
        return {"c": "confirmed" if removed else "suspected"}

    arms = _arms(("x", "g1", ("c",)), ("y", "g1", ("c",)))
    replayer = DelayedReplayer({"baseline": 1.0, "x": 0.0, "y": 0.0}, {slow: 0.01})
    asyncio.run(Scheduler(look_schedule(64), 64, judge=judge).run(arms, ["x", "y"], replayer))
    assert (arms["x"].decision, arms["x"].n) == ("removes", 8)
    assert (arms["y"].decision, arms["y"].n) == ("removes", 8)
