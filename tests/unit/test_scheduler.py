"""The sequential scheduler with a fake replayer: no llama-server, no database."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from kb.domain.diagnosis import Finding
from kb.domain.records import Reply
from triage.causes import ArmOutcome
from triage.engine.reproduction import Signature, gate_message
from triage.engine.scheduler import ArmFailed, ArmState, Scheduler
from triage.stats import look_schedule


class FakeReplayer:
    """Each arm fails with a fixed probability; replay i of an arm is decided by a RNG
    seeded with (arm, i), so a schedule is deterministic and seeds are paired."""

    def __init__(
        self,
        rates: dict[str, float],
        *,
        crash: dict[str, int] | None = None,
        kinds: dict[str, list[str]] | None = None,
    ) -> None:
        self.rates = rates
        self.crash = crash or {}  # arm -> fail with ArmFailed once it has sent this many
        self.kinds = kinds or {}
        self.sent: dict[str, list[int]] = {}

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        sent = self.sent.setdefault(arm, [])
        if arm in self.crash and len(sent) + len(indices) > self.crash[arm]:
            raise ArmFailed(f"server of {arm} died (exit code -11)", "Segmentation fault")
        sent.extend(indices)
        replies = []
        for index in indices:
            failed = random.Random(f"{arm}/{index}").random() < self.rates[arm]
            kinds = self.kinds.get(arm, ["length-stop"]) if failed else []
            replies.append(
                Reply(
                    arm,
                    index,
                    1000 + index,
                    failed,
                    kinds,
                    "length" if failed else "stop",
                    0,
                    0,
                    200,
                    0.01,
                    {},
                )
            )
        return replies


def _arms(*specs: tuple[str, str, tuple[str, ...]]) -> dict[str, ArmState]:
    arms = {"baseline": ArmState("baseline", "as sent", "request", "g1")}
    for name, group, decides in specs:
        arms[name] = ArmState(name, name, "request", group, decides)
    return arms


def _run(
    arms: dict[str, ArmState],
    replayer: FakeReplayer,
    cap: int = 64,
    judge=None,
    recorded: list[Reply] | None = None,
) -> None:  # type: ignore[no-untyped-def]
    sink = recorded.extend if recorded is not None else (lambda replies: None)
    scheduler = Scheduler(look_schedule(cap), cap, judge=judge, on_replies=sink)
    asyncio.run(scheduler.run(arms, [n for n in arms if n != "baseline"], replayer))


def test_deterministic_failure_is_decided_at_the_second_look() -> None:
    arms = _arms(("fix", "g1", ("c",)), ("same", "g1", ("c",)))
    recorded: list[Reply] = []
    replayer = FakeReplayer({"baseline": 1.0, "fix": 0.0, "same": 1.0})
    _run(arms, replayer, recorded=recorded)
    # "removes" needs five fixed failures (never one sample): the second look, n=8.
    assert arms["fix"].decision == "removes" and arms["fix"].n == 8
    assert arms["fix"].stopped == "decided at look 2 (n=8)"
    # A deterministic failure the arm keeps is "unchanged" at the first look (4 vs 4).
    assert arms["same"].decision == "unchanged" and arms["same"].n == 4
    assert arms["baseline"].n == 8 and arms["baseline"].failures == 8
    # Seeds are paired: every arm replayed indices 0..n-1 once, every reply was recorded.
    assert {arm: sorted(sent) for arm, sent in replayer.sent.items()} == {
        "baseline": list(range(8)),
        "fix": list(range(8)),
        "same": list(range(4)),
    }
    assert len(recorded) == 20


def test_intermittent_failure_needs_more_replays_and_stays_honest() -> None:
    arms = _arms(("fix", "g1", ("c",)), ("same", "g1", ("c",)))
    _run(arms, FakeReplayer({"baseline": 0.4, "fix": 0.0, "same": 0.4}))
    base = arms["baseline"]
    assert 0 < base.failures < base.n
    assert arms["fix"].decision == "removes" and arms["fix"].n > 8
    # Decided by the anytime-valid e-value bet; its reported Fisher p agrees.
    assert arms["fix"].p_less is not None and arms["fix"].p_less < 0.05
    assert arms["same"].decision == "unchanged"


def test_an_arm_that_never_separates_stops_at_the_cap() -> None:
    arms = _arms(("half", "g1", ("c",)))
    _run(arms, FakeReplayer({"baseline": 0.6, "half": 0.25}), cap=16)
    assert arms["half"].decision == "undecided"
    assert arms["half"].n == 16 and arms["half"].stopped == "cap of 16 reached"


def _judge(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
    """Cause c is confirmed when arm a or arm b removes the failure."""
    removed = any(outcomes[n].decision == "removes" for n in ("a", "b") if n in outcomes)
    return {"c": "confirmed" if removed else "suspected"}


def test_an_arm_whose_causes_are_settled_is_moot() -> None:
    arms = _arms(("a", "g1", ("c",)), ("b", "g1", ("c",)), ("info", "g1", ()))
    # b fixes one failure in five: far from deciding anything by the time a has.
    _run(arms, FakeReplayer({"baseline": 1.0, "a": 0.0, "b": 0.8, "info": 0.5}), judge=_judge)
    assert arms["a"].decision == "removes"
    # b can no longer change c's verdict: stopped at the look where a decided it.
    assert arms["b"].n == 8 and "not needed" in arms["b"].stopped
    assert "c stays confirmed" in arms["b"].stopped
    # An arm that decides no cause is informational: it runs to its own decision or the cap.
    assert arms["info"].n > 8


def test_without_the_deciding_arm_the_other_one_is_not_moot() -> None:
    arms = _arms(("b", "g1", ("c",)))
    _run(arms, FakeReplayer({"baseline": 1.0, "b": 0.8}), cap=32, judge=_judge)
    assert "not needed" not in arms["b"].stopped
    assert arms["b"].n > 8


def test_a_crashed_server_errors_its_arms_and_the_others_go_on() -> None:
    arms = _arms(("fix", "g1", ("c",)), ("crash", "g2", ("d",)), ("sibling", "g2", ("d",)))
    # Both g2 arms stay undecided after the first look, so the crash on the second look
    # finds them running.
    _run(
        arms,
        FakeReplayer(
            {"baseline": 1.0, "fix": 0.0, "crash": 0.3, "sibling": 0.8}, crash={"crash": 4}
        ),
    )
    assert arms["crash"].decision == "errored"
    assert arms["crash"].stopped == "server crashed" and "-11" in arms["crash"].error
    assert arms["crash"].log_tail == "Segmentation fault"
    assert arms["sibling"].decision == "errored"  # same server (group)
    assert arms["fix"].decision == "removes"


def test_a_crashed_baseline_stops_the_run() -> None:
    arms = _arms(("fix", "g2", ("c",)))
    _run(arms, FakeReplayer({"baseline": 1.0, "fix": 0.0}, crash={"baseline": 4}))
    assert arms["baseline"].decision == "errored"
    assert arms["fix"].stopped == "baseline server failed"
    assert arms["fix"].n == 8  # the look in flight completes, no look after it
    assert arms["fix"].decision == "undecided"  # never decided against a dead baseline


def test_resumed_replies_are_not_sent_again() -> None:
    arms = _arms(("fix", "g1", ("c",)))
    for i in range(4):
        arms["baseline"].replies.append(
            Reply("baseline", i, 1000 + i, True, ["length-stop"], "length", 0, 0, 200, 0.0, {})
        )
    replayer = FakeReplayer({"baseline": 1.0, "fix": 0.0})
    _run(arms, replayer)
    assert replayer.sent["baseline"] == [4, 5, 6, 7]
    assert arms["fix"].decision == "removes"


def test_errored_arm_outcome_reports_errored_when_it_has_no_replies() -> None:
    arm = ArmState("x", "x", "server", "g9", ("c",))
    arm.error, arm.decision = "did not start", "errored"
    outcome = arm.outcome()
    assert outcome.decision == "errored" and not outcome.ran


# --------------------------------------------------------------------------- the gate


def _baseline(*replies: Reply) -> ArmState:
    arm = ArmState("baseline", "as sent", "request", "g1")
    arm.replies.extend(replies)
    return arm


def _reply(kinds: list[str], status: int | None = 200, error: str = "") -> Reply:
    return Reply("baseline", 0, 1, True, kinds, "length", 0, 0, status, 0.0, {}, error=error)


def test_gate_refuses_replays_that_the_server_rejects() -> None:
    signature = Signature.from_findings([Finding("empty-content", False, 1.0, "")], {"status": 200})
    message = gate_message(signature, _baseline(*[_reply(["http-error"], 400)] * 4))
    assert message is not None
    assert "did not reproduce" in message and "HTTP 400" in message and "4/4" in message


def test_gate_refuses_a_dead_server_and_a_different_symptom() -> None:
    signature = Signature.from_findings([Finding("http-error", False, 1.0, "")], {"status": 502})
    assert signature.status_class == 5
    refused = _reply(["http-error"], None, error="cannot connect to llama-server")
    assert "no reply" in (gate_message(signature, _baseline(refused, refused)) or "")
    length = _reply(["length-stop", "empty-content"], 200)
    message = gate_message(signature, _baseline(length, length))
    assert message is not None and "length-stop" in message and "5xx" in message


@pytest.mark.parametrize(
    "findings, exchange",
    [
        ([Finding("length-stop", False, 1.0, "")], {"status": 200}),
        ([], {}),  # reproducing from the request alone: any failure counts
    ],
)
def test_gate_passes_the_captured_failure(findings, exchange) -> None:  # type: ignore[no-untyped-def]
    signature = Signature.from_findings(findings, exchange)
    ok = Reply("baseline", 1, 2, False, [], "stop", 10, 0, 200, 0.0, {})
    assert gate_message(signature, _baseline(ok, _reply(["length-stop"]))) is None
    assert gate_message(signature, _baseline(ok, ok)) is None  # nothing failed yet


class _PooledReplayer(FakeReplayer):
    """A replayer that keeps connection pools: the scheduler must close them."""

    def __init__(self, rates: dict[str, float], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(rates, **kwargs)
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


def test_replies_are_stored_as_each_arm_finishes_and_pools_closed_even_on_a_crash() -> None:
    arms = _arms(("fix", "g1", ("c",)), ("same", "g1", ("c",)), ("boom", "g2", ("d",)))
    writes: list[list[str]] = []
    replayer = _PooledReplayer(
        {"baseline": 1.0, "fix": 0.0, "same": 1.0, "boom": 0.0}, crash={"boom": 4}
    )
    scheduler = Scheduler(
        look_schedule(64),
        64,
        on_replies=lambda replies: writes.append(sorted({r.arm for r in replies})),
    )
    asyncio.run(scheduler.run(arms, ["fix", "same", "boom"], replayer))
    # One write per arm and look, as soon as its replies are in (an interrupted run keeps
    # them); boom's server dies at its second top-up and the others' replies still land.
    assert sorted(map(tuple, writes)) == sorted(
        [("baseline",), ("fix",), ("same",), ("boom",), ("baseline",), ("fix",)]
    )
    assert arms["boom"].decision == "errored" and arms["fix"].decision == "removes"
    assert replayer.closed == 1
    # The reproduction gate's baseline look closes its pools too.
    gate = _arms()
    asyncio.run(scheduler.baseline_look(gate, 4, replayer))
    assert gate["baseline"].n == 4 and replayer.closed == 2


class _CountingClient:
    """A LlamaClient double: /props says 3 slots; counts clients, requests in flight, closes."""

    made: list[_CountingClient] = []

    def __init__(self, url: str, timeout: float = 0.0, api_key: str | None = None) -> None:
        self.in_flight = self.peak = self.chats = 0
        self.closed = False
        _CountingClient.made.append(self)

    async def props(self) -> dict[str, int]:
        return {"total_slots": 3}

    async def chat(self, body: dict) -> object:  # type: ignore[type-arg]
        from triage.llama.client import ChatResult

        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.chats += 1
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        payload = {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"seed {body['seed']} ok"},
                }
            ],
            "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0},
        }
        return ChatResult(200, payload, b"{}", 0.001)

    async def aclose(self) -> None:
        self.closed = True


def test_arms_on_one_server_share_its_pool_and_its_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import triage.llama.client as client_mod
    from triage.engine.replayer import ArmRoute, LlamaReplayer
    from triage.engine.servers import Server
    from triage.stackfile import ServerConfig

    class _Alive:
        def alive(self) -> bool:
            return True

    monkeypatch.setattr(client_mod, "LlamaClient", _CountingClient)
    _CountingClient.made = []
    # A launched server whose slots nobody observed yet (a server-level arm's own server).
    server = Server("k", ServerConfig(model="m.gguf"), "http://127.0.0.1:1", 1, 0.0, _Alive())
    replayer = LlamaReplayer({"messages": [{"role": "user", "content": "hi"}]}, 1000, 5.0)
    for arm in ("baseline", "a", "b"):
        replayer.routes[arm] = ArmRoute(server, lambda body: body)
    arms = _arms(("a", "k", ("c",)), ("b", "k", ("c",)))
    asyncio.run(Scheduler([8], 8).run(arms, ["a", "b"], replayer))
    # One client (one keep-alive pool) for the three arms, 24 replays through it, never more
    # than the server's 3 slots in flight, closed when the run ended.
    assert len(_CountingClient.made) == 1
    client = _CountingClient.made[0]
    assert client.chats == 24 and client.peak == 3 and client.closed
    assert server.slots == 3
    assert sorted(r.seed for r in arms["a"].replies) == list(range(1000, 1008))
    assert not any(r.failed for arm in arms.values() for r in arm.replies)


def _judge_unchanged(outcomes: dict[str, ArmOutcome]) -> dict[str, str]:
    """Cause c is rejected once arm u leaves the failure unchanged, whatever arm x shows."""
    return {"c": "rejected" if outcomes["u"].decision == "unchanged" else "suspected"}


def test_an_arm_is_moot_once_the_baseline_has_the_failures_any_verdict_needs() -> None:
    # Baseline fails on seeds 0, 1, 2 only, u fails on the same seeds: "unchanged" at the
    # first look (three concordant failures, stats.min_deciding_failures()), and x -- which
    # cannot move c any more -- stops there too, instead of waiting for a fourth failure.
    class _Seeds(FakeReplayer):
        async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
            replies = await super().replay(arm, indices)
            for reply in replies:
                reply.failed = arm in ("baseline", "u") and reply.index < 3
                reply.kinds = ["length-stop"] if reply.failed else []
            return replies

    arms = _arms(("u", "g1", ("c",)), ("x", "g1", ("c",)))
    _run(arms, _Seeds({"baseline": 0.0, "u": 0.0, "x": 0.0}), judge=_judge_unchanged)
    assert arms["u"].decision == "unchanged" and arms["u"].n == 4
    assert arms["x"].n == 4 and "c stays rejected" in arms["x"].stopped
    assert arms["baseline"].n == 4
