"""Issue 28 item 2: replay time limits from the server's measured speed, and "hung" only
when the server's /slots stops moving -- a slow server is waited for, never called hung.
Fakes of the client here; tests/integration/test_engine_slow.py runs a real slowed server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from triage.engine.pacing import PaceOptions, ReplayTimeout, ServerPace, timed_chat

FAST = PaceOptions(first=0.2, floor=0.1, cap=30.0, stall=0.6, poll=0.05)


@dataclass
class _Result:
    status_code: int
    json: Any


@dataclass
class FakeServer:
    """A chat that takes `seconds` (None: never ends) while /slots shows `decoded` tokens
    growing by `step` per poll (0: stuck)."""

    seconds: float | None
    step: int = 1
    slots: bool = True
    n_ctx: int = 4096
    decoded: int = 0
    polls: list[int] = field(default_factory=list)

    async def chat(self, body: dict[str, Any], *, timeout: float | None = None) -> _Result:
        if self.seconds is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.seconds or 0)
        timings = {"predicted_per_second": 5.0, "predicted_n": 20, "prompt_ms": 100.0}
        return _Result(200, {"choices": [], "timings": timings})

    async def request(self, method: str, path: str, *, timeout: float | None = None) -> _Result:
        assert path == "/slots"
        if not self.slots:
            return _Result(501, {"error": {"message": "This server does not support slots"}})
        self.decoded += self.step
        self.polls.append(self.decoded)
        state = {"n_decoded": self.decoded}
        return _Result(
            200,
            [{"id": 0, "n_ctx": self.n_ctx, "is_processing": True, "next_token": [state]}],
        )


def _chat(server: FakeServer, options: PaceOptions = FAST, **body: Any) -> Any:
    pace = ServerPace(options)
    return asyncio.run(timed_chat(server, {"messages": [], **body}, pace)), pace


def test_a_slow_reply_past_its_budget_is_waited_for_while_the_server_decodes() -> None:
    server = FakeServer(seconds=1.5, step=3)  # 7x its first budget, tokens keep coming
    result, pace = _chat(server)
    assert result.status_code == 200
    assert len(server.polls) >= 2  # it looked at /slots instead of giving up
    assert list(pace.decode) == [5.0]  # and learnt the server's speed from the reply


def test_a_reply_is_a_hang_only_when_no_slot_moves_for_the_stall_time() -> None:
    server = FakeServer(seconds=None, step=0)
    with pytest.raises(ReplayTimeout) as stalled:
        _chat(server)
    assert stalled.value.kind == "timeout"
    assert "no progress" in str(stalled.value) and "/slots" in str(stalled.value)


def test_a_server_still_decoding_at_the_cap_is_given_up_as_slow_not_hung() -> None:
    server = FakeServer(seconds=None, step=2)
    with pytest.raises(ReplayTimeout) as slow:
        _chat(server, PaceOptions(first=0.1, floor=0.1, cap=1.0, stall=30.0, poll=0.05))
    assert slow.value.kind == "slow"
    assert "slow, not hung" in str(slow.value)


def test_a_generation_past_its_slot_context_is_one_that_does_not_end() -> None:
    server = FakeServer(seconds=None, step=5000, n_ctx=2048)
    with pytest.raises(ReplayTimeout) as runaway:
        _chat(server)
    assert runaway.value.kind == "timeout" and "does not end" in str(runaway.value)


def test_without_slots_the_measured_budget_is_the_limit_and_the_message_says_so() -> None:
    server = FakeServer(seconds=None, slots=False)
    with pytest.raises(ReplayTimeout) as limited:
        _chat(server)
    assert limited.value.kind == "timeout"
    assert "no /slots" in str(limited.value) and "within 0s" not in str(limited.value)


def test_the_budget_comes_from_the_measured_speed_and_the_requested_tokens() -> None:
    pace = ServerPace(PaceOptions(first=180.0, floor=30.0, cap=1800.0))
    assert pace.budget({"max_tokens": 1024}).seconds == 180.0  # nothing measured yet
    pace.observe({"predicted_per_second": 2.0, "predicted_n": 64, "prompt_ms": 4000.0})
    pace.observe({"predicted_per_second": 8.0, "predicted_n": 64, "prompt_ms": 1000.0})
    # 1024 tokens at the slowest measured 2 tok/s plus 4 s of prompt, x3, + 5 s.
    budget = pace.budget({"max_tokens": 1024})
    assert budget.seconds == pytest.approx(3 * (4 + 512) + 5)
    assert "1024 tokens at the measured 2.0 tokens/s" in budget.why
    # Floor and cap.
    assert pace.budget({"max_tokens": 1}).seconds == 30.0
    assert pace.budget({"max_tokens": 100_000}).seconds == 1800.0
    # No max_tokens: twice the longest reply measured.
    assert pace.budget({}).seconds == pytest.approx(3 * (4 + 128 / 2) + 5)


def test_replays_queued_behind_a_stalled_one_fail_at_their_budget() -> None:
    server = FakeServer(seconds=None, step=0)
    pace = ServerPace(FAST)

    async def two() -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for _ in range(2):  # one slot: the second waits for the first
            try:
                await timed_chat(server, {"messages": []}, pace)
                out.append(None)
            except ReplayTimeout as exc:
                out.append(exc)
        return out

    first, second = asyncio.run(two())
    assert isinstance(first, ReplayTimeout) and "no progress" in str(first)
    assert isinstance(second, ReplayTimeout) and second.kind == "timeout"
    assert "an earlier replay stalled" in str(second)
    # Progress clears it: a reply that comes back.
    pace.observe({"predicted_per_second": 5.0, "predicted_n": 20})
    assert pace.stalled is None
