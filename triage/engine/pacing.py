"""Replay time limits from the server's measured speed; "hung" only when nothing moves.

A fixed time limit per replay calls a slow server hung: on a busy CPU at ~1 token/s, the
token-limit arm's 4x tokens took longer than 180 s, every arm errored "llama-server hung"
and no verdict came out (issue 28). Here each replay gets a budget from what the server
itself measured on earlier replies (llama-server's `timings`: decode tokens/s
`predicted_per_second`, prompt time `prompt_ms`) and the tokens the replay asks for:

    budget = SAFETY x (prompt seconds + requested tokens / decode tokens per second) + SLACK

clamped to [floor, cap]; before any reply is measured, the `first` budget. A replay that
outlives its budget is not declared hung: the server's `/slots` is polled, and as long as a
slot's decoded (or prompt) token count moves, the replay is slow, and waited for -- up to
`cap` in all, then given up as "slow, not hung" (an errored reply, the server left alone).
Only a replay past its budget during which no slot moved for `stall` seconds is a hang
(`timeout`: the launched server is then stopped and its CrashReport kept). A server without
`/slots` (`--no-slots`) shows no progress: its replay times out at the budget, and the
message says that progress was not observable.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kb.jsontypes import JsonObject
from triage.llama.client import LlamaClientError

__all__ = ["Budget", "PaceOptions", "ReplayTimeout", "ServerPace", "requested_tokens", "timed_chat"]

SAFETY = 3.0  # times the measured time a replay may take before its progress is checked
SLACK = 5.0  # seconds added to every budget (HTTP, scheduling)
KEEP = 16  # measured replies remembered per server
SLOTS_TIMEOUT = 10.0  # seconds for one /slots poll


@dataclass(frozen=True)
class PaceOptions:
    first: float = 180.0  # budget before the server's speed is measured
    floor: float = 30.0
    cap: float = 1800.0  # one replay never takes longer than this, however it progresses
    stall: float = 120.0  # no progress this long (past the budget) is a hang
    poll: float = 5.0  # seconds between /slots polls while a replay is over budget


@dataclass(frozen=True)
class Budget:
    seconds: float
    why: str  # how it was computed, for messages


class ReplayTimeout(Exception):
    """A replay ended without a reply: `kind` "timeout" (no progress: hung) or "slow"
    (still progressing at the cap, or no way to see progress)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def requested_tokens(body: JsonObject) -> int | None:
    for name in ("max_tokens", "max_completion_tokens", "n_predict"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


@dataclass
class ServerPace:
    """One server's measured speed, and the progress its `/slots` shows."""

    options: PaceOptions = field(default_factory=PaceOptions)
    decode: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))  # tokens/s
    prompt: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))  # seconds
    longest: int = 0  # the most tokens a measured reply decoded
    n_ctx: int | None = None  # per-slot context (what a replay without max_tokens can reach)
    # /slots: the last snapshot, when it last changed, when it was read; None: unavailable
    snapshot: Any = None
    changed_at: float | None = None
    polled_at: float | None = None
    slots_available: bool | None = None
    runaway: str | None = None  # a slot decoding past its own context (never ends)
    # Set when a replay on this server stalled, cleared by any progress: replays queued
    # behind a stalled one fail at their budget instead of each waiting `stall` again.
    stalled: str | None = None

    def observe(self, timings: JsonObject) -> None:
        """Learn from one reply's llama-server timings."""
        speed = _number(timings.get("predicted_per_second"))
        decoded = int(_number(timings.get("predicted_n")) or 0)
        if speed is not None and decoded >= 2:
            self.decode.append(speed)
        self.longest = max(self.longest, decoded)
        self.stalled = None  # it answered
        prompt_ms = _number(timings.get("prompt_ms"))
        if prompt_ms is not None:
            self.prompt.append(prompt_ms / 1000)

    def budget(self, body: JsonObject) -> Budget:
        """The time one replay of `body` may take before its progress is checked."""
        opts = self.options
        if not self.decode:
            return Budget(opts.first, "no reply of this server measured yet")
        # Without max_tokens: twice the longest reply seen (replays of one request), else
        # the slot's context.
        tokens = requested_tokens(body) or (2 * self.longest if self.longest else self.n_ctx)
        speed = min(self.decode)  # the slowest recent reply: a bound, not an average
        prompt = max(self.prompt, default=0.0)
        if tokens is None:
            return Budget(opts.cap, "no max_tokens and no known context: the cap")
        estimate = prompt + tokens / speed
        seconds = min(opts.cap, max(opts.floor, SAFETY * estimate + SLACK))
        return Budget(
            seconds,
            f"{tokens} tokens at the measured {speed:.1f} tokens/s"
            + (f" plus {prompt:.1f}s of prompt" if prompt >= 0.05 else "")
            + f", x{SAFETY:g}, within [{opts.floor:g}s, {opts.cap:g}s]",
        )

    async def poll(self, client: Any, now: float) -> None:
        """Read /slots (at most once per `poll` seconds across concurrent replays)."""
        if self.slots_available is False:
            return
        if self.polled_at is not None and now - self.polled_at < self.options.poll / 2:
            return
        self.polled_at = now
        try:
            result = await client.request("GET", "/slots", timeout=SLOTS_TIMEOUT)
        except LlamaClientError:
            return  # a /slots that does not answer shows no progress
        if result.status_code in (404, 501) or not isinstance(result.json, list):
            self.slots_available = result.status_code < 400 and isinstance(result.json, list)
            return
        self.slots_available = True
        slots = [s for s in result.json if isinstance(s, dict)]
        snapshot = tuple(sorted(_slot_state(s) for s in slots))
        if snapshot != self.snapshot:
            if self.snapshot is not None:
                self.stalled = None  # it moved
            self.snapshot = snapshot
            self.changed_at = now
        self.runaway = next((r for r in map(_runaway, slots) if r), None)


def _runaway(slot: JsonObject) -> str | None:
    """A processing slot that decoded more tokens than its context holds: only context
    shift keeps such a generation going, and it does not end by itself -- not slow."""
    nxt = slot.get("next_token")
    first = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else {}
    decoded, n_ctx = first.get("n_decoded"), slot.get("n_ctx")
    if not slot.get("is_processing") or not isinstance(decoded, int):
        return None
    if isinstance(n_ctx, int) and n_ctx > 0 and decoded > n_ctx:
        return f"slot {slot.get('id')} decoded {decoded} tokens in its {n_ctx}-token context"
    return None


def _slot_state(slot: JsonObject) -> tuple[Any, ...]:
    nxt = slot.get("next_token")
    first = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else {}
    return (
        str(slot.get("id")),
        str(slot.get("id_task")),
        bool(slot.get("is_processing")),
        str(first.get("n_decoded")),
        str(slot.get("n_prompt_tokens_processed")),
    )


async def timed_chat(
    client: Any, body: JsonObject, pace: ServerPace, *, stream: bool = False
) -> Any:
    """`client.chat(body)` (`chat_stream` when `stream`) within its budget, waited for past
    it while the server progresses; ReplayTimeout when it stalls (kind "timeout") or is
    given up at the cap (kind "slow")."""
    opts = pace.options
    budget = pace.budget(body)
    started = time.monotonic()
    call = client.chat_stream if stream else client.chat
    task = asyncio.ensure_future(call(body, timeout=max(opts.cap, budget.seconds)))
    try:
        done, _ = await asyncio.wait({task}, timeout=budget.seconds)
        if not done:
            await _watch(client, task, pace, budget, started)
        try:
            result = task.result()
        except LlamaClientError as exc:
            if getattr(exc, "kind", "") == "timeout":
                raise _slow(pace, budget, time.monotonic() - started) from None
            raise
        timings = getattr(result, "timings", None) if stream else None
        if not stream and isinstance(result.json, dict):
            timings = result.json.get("timings")
        if isinstance(timings, dict):
            pace.observe(timings)
        return result
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _watch(
    client: Any, task: asyncio.Future[Any], pace: ServerPace, budget: Budget, started: float
) -> None:
    """Past the budget: wait while /slots moves; raise when it stops moving or at the cap."""
    opts = pace.options
    watch_from = time.monotonic()
    while True:
        now = time.monotonic()
        if pace.stalled:
            raise ReplayTimeout(
                f"no complete answer within its budget of {_secs(budget.seconds)}, and the "
                f"server has shown no progress since an earlier replay stalled ({pace.stalled})",
                "timeout",
            )
        await pace.poll(client, now)
        now = time.monotonic()
        if pace.slots_available is False:
            # No way to see progress: the budget (from the measured speed) is the limit.
            raise ReplayTimeout(
                f"no complete answer within {_secs(budget.seconds)} (budget: {budget.why}); "
                "the server shows no progress (no /slots), so a stall cannot be told from "
                "a slow reply",
                "timeout",
            )
        if pace.runaway:
            raise ReplayTimeout(
                f"the generation does not end: {pace.runaway} (the context shifts and it "
                f"goes on); no answer after {_secs(now - started)}",
                "timeout",
            )
        moved = max(pace.changed_at or watch_from, watch_from)
        if now - moved >= opts.stall:
            pace.stalled = f"no progress for {_secs(now - moved)}"
            raise ReplayTimeout(
                f"no progress for {_secs(now - moved)}: no slot decoded a token or processed "
                f"prompt (/slots) after the reply's budget of {_secs(budget.seconds)} "
                f"({budget.why}); {_secs(now - started)} in all",
                "timeout",
            )
        if now - started >= opts.cap:
            raise _slow(pace, budget, now - started)
        done, _ = await asyncio.wait({task}, timeout=opts.poll)
        if done:
            return


def _secs(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def _slow(pace: ServerPace, budget: Budget, elapsed: float) -> ReplayTimeout:
    return ReplayTimeout(
        f"still decoding after {_secs(elapsed)} (the cap of {pace.options.cap:g}s per replay; "
        f"budget {_secs(budget.seconds)}: {budget.why}): slow, not hung -- given up",
        "slow",
    )
