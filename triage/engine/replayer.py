"""The production `Replayer`: replays through the llama client and scores each reply with
the capture + symptom layers. The only module of the engine that knows those APIs."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from kb.domain.records import Reply
from kb.jsontypes import JsonObject
from triage import probes, symptoms
from triage.capture import CaptureError, exchange_from_http
from triage.causes import BASELINE
from triage.engine.crashes import CRASH_KIND, HANG_KIND, crash_reply, startup_crash
from triage.engine.pacing import PaceOptions, ReplayTimeout, ServerPace, timed_chat
from triage.engine.scheduler import ArmFailed
from triage.engine.server_log import replay_window
from triage.engine.servers import Server, open_server
from triage.llama import client as llama_client
from triage.llama.client import LlamaClientError
from triage.observe import committed_text, finish_reason_of, message_of, raw_misplaced
from triage.symptoms import failure_kinds

__all__ = ["ArmRoute", "LlamaReplayer", "Slots", "classify_reply", "score_one", "scored_copy"]


def classify_reply(
    request: JsonObject,
    status: int | None,
    body: Any,
    elapsed: float,
    *,
    timed_out: bool = False,
) -> tuple[bool, list[str]]:
    """Is this reply a failure, and which failure kinds does it show? (capture + symptoms)"""
    try:
        exchange = exchange_from_http(
            request, body, status=status, elapsed_ms=elapsed * 1000, timed_out=timed_out
        )
    except CaptureError:
        return True, ["http-error"]
    kinds = failure_kinds(exchange)
    # A reply fails when its user would see it broken (symptoms.USER_FACING_KINDS); the
    # diagnostic kinds (runaway reasoning) are kept to explain a failure but do not fail a
    # reply on their own.
    return bool(kinds & symptoms.USER_FACING_KINDS), sorted(kinds)


VERBOSE_SCALAR_MAX = 256  # characters of a `__verbose` string the symptom checks still see


def scored_copy(payload: Any) -> Any:
    """The reply the symptom checks score: `payload` with its `__verbose` block (the raw
    text, prompt, tokens and settings llama-server adds because the engine asks for it)
    cut to its scalar fields -- counts, flags, short strings such as `tokens_predicted`,
    `truncated`, `stop_type`. Capturing the whole block (redaction and schema validation of
    the prompt and raw text again) was most of the engine's Python time per reply, and no
    symptom check reads more of it (the raw text is read from the payload itself:
    observe.raw_misplaced, committed_text)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("__verbose"), dict):
        return payload
    verbose = {
        key: value
        for key, value in payload["__verbose"].items()
        if value is None
        or isinstance(value, (bool, int, float))
        or (isinstance(value, str) and len(value) <= VERBOSE_SCALAR_MAX)
    }
    return {**payload, "__verbose": verbose}


async def score_one(
    client: Any,
    arm: str,
    body: JsonObject,
    index: int,
    seed: int,
    sem: AbstractAsyncContextManager[Any],
    pace: ServerPace | None = None,
    *,
    stream: bool = False,
) -> Reply:
    """Send one replicate (streamed when `stream`) and score it (failure kinds, lengths,
    timings). With `pace`, its time limit comes from the server's measured speed and a
    slow reply is waited for while the server progresses (triage.engine.pacing); a reply
    that ends without an answer is an errored reply whose error says why."""
    async with sem:
        started = time.monotonic()
        try:
            if stream:
                streamed = await (
                    client.chat_stream(body)
                    if pace is None
                    else timed_chat(client, body, pace, stream=True)
                )
                return _scored_stream(arm, body, index, seed, streamed)
            result = await (client.chat(body) if pace is None else timed_chat(client, body, pace))
        except ReplayTimeout as exc:
            elapsed = time.monotonic() - started
            return Reply(
                arm, index, seed, True, [exc.kind], None, 0, 0, None, elapsed, {}, error=str(exc)
            )
        except LlamaClientError as exc:
            elapsed = time.monotonic() - started
            kind = "timeout" if getattr(exc, "kind", "") == "timeout" else "http-error"
            return Reply(
                arm, index, seed, True, [kind], None, 0, 0, None, elapsed, {}, error=str(exc)
            )
    payload = result.json
    failed, kinds = classify_reply(
        body,
        result.status_code,
        scored_copy(payload) if payload is not None else result.raw,
        result.elapsed,
    )
    message = message_of(payload)
    timings = dict(payload.get("timings") or {}) if isinstance(payload, dict) else {}
    return Reply(
        arm,
        index,
        seed,
        failed,
        kinds,
        finish_reason_of(payload),
        len(str(message.get("content") or "")),
        len(str(message.get("reasoning_content") or "")),
        result.status_code,
        result.elapsed,
        timings,
        raw_misplaced=raw_misplaced(payload),
        text=committed_text(payload),
    )


def _scored_stream(arm: str, body: JsonObject, index: int, seed: int, result: Any) -> Reply:
    """A streamed reply scored like a non-streamed one: the SSE bytes as received (a
    gateway's error page when it answered instead), the message re-assembled from them."""
    request = {**body, "stream": True}
    failed, kinds = classify_reply(request, result.status_code, result.raw, result.elapsed)
    if result.status_code == 200 and not result.ok and "truncated-stream" not in kinds:
        failed, kinds = True, sorted({*kinds, "truncated-stream"})
    return Reply(
        arm,
        index,
        seed,
        failed,
        kinds,
        result.finish_reason,
        len(result.content),
        len(result.reasoning_content),
        result.status_code,
        result.elapsed,
        dict(result.timings),
        text=result.content,
    )


@dataclass
class ArmRoute:
    """Where an arm's replays go, how its request is varied, and whether it streams."""

    server: Server
    transform: Callable[[JsonObject], JsonObject]
    stream: bool = False


class Slots:
    """At most `size` requests in flight; when they wait for a slot, the baseline's go
    before other arms' (every arm's look compares with the baseline's replays), each kind in
    the order it asked."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def take(self, arm: str) -> AbstractAsyncContextManager[None]:
        return self._hold(0 if arm == BASELINE else 1)

    @contextlib.asynccontextmanager
    async def _hold(self, priority: int) -> AsyncIterator[None]:
        if self.free > 0 and not self.waiting:
            self.free -= 1
        else:
            granted = asyncio.get_running_loop().create_future()
            heapq.heappush(self.waiting, (priority, next(self._order), granted))
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # handed a slot just as it was cancelled
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self.waiting:
            granted = heapq.heappop(self.waiting)[2]
            if not granted.done():  # a cancelled waiter is skipped
                granted.set_result(None)
                return
        self.free += 1


@dataclass
class _Pool:
    """One keep-alive connection pool and one slot semaphore per server, for one event loop
    (httpx connections belong to the loop that opened them; each asyncio.run is a new one)."""

    loop: asyncio.AbstractEventLoop
    client: Any  # LlamaClient
    slots: Slots


@dataclass
class LlamaReplayer:
    """Replays `request` (through each arm's transform) on each arm's server.

    Every arm on one server shares that server's connection pool (kept alive across looks and
    arms until `aclose`) and one semaphore sized to its slots, so at most `slots` requests
    are in flight per server whatever the number of arms. A launched server whose slots are
    not known yet (only the incident's server is observed) is asked once (`/props`)."""

    request: JsonObject
    seed: int
    timeout: float
    concurrency: int | None = None
    pace_options: PaceOptions | None = None  # None: a fixed `timeout` per replay
    routes: dict[str, ArmRoute] = field(default_factory=dict)
    pools: dict[str, _Pool] = field(default_factory=dict, repr=False)
    # Per arm: the arm's request (transform applied once; replies differ only in the seed).
    bodies: dict[str, JsonObject] = field(default_factory=dict, repr=False)

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        route = self.routes[arm]
        server = route.server
        if not server.alive():
            raise ArmFailed(server.death_message(), server.log_tail())
        pool = await self._pool(server)
        body = self.bodies.get(arm)
        if body is None:
            body = self.bodies[arm] = route.transform(self.request)
        tasks = [
            score_one(
                pool.client,
                arm,
                probes.replay_body(body, self.seed + index),
                index,
                self.seed + index,
                replay_window(server, arm, index, body, pool.slots.take(arm)),
                self._pace(server),
                stream=route.stream,
            )
            for index in indices
        ]
        replies = crashed_replies(server, list(await asyncio.gather(*tasks)))
        if server.failure is not None and arm != BASELINE:
            # The shared server crashed (or hung) under another arm's variant: a crash is
            # not this arm's measurement of the captured failure, so the arm errors.
            raise ArmFailed(server.death_message(), server.log_tail())
        return replies

    def _pace(self, server: Server) -> ServerPace | None:
        """The server's measured pace (kept on the server, across looks and arms)."""
        if self.pace_options is None:
            return None
        if server.pace is None:
            server.pace = ServerPace(self.pace_options)
        return server.pace  # type: ignore[no-any-return]

    async def _pool(self, server: Server) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self.pools.get(server.base_url)
        if pool is not None and pool.loop is loop:
            return pool
        # The client's own limit (inspection calls, replays without a pace) stays
        # `timeout`; a paced replay passes its own (triage.engine.pacing.timed_chat).
        client = llama_client.LlamaClient(
            server.base_url, timeout=self.timeout, api_key=server.api_key
        )
        if self.concurrency is None and server.slots <= 1 and server.handle is not None:
            server.slots = await _server_slots(client, server.slots)
        slots = self.concurrency or max(1, min(server.slots, 4))
        pool = self.pools[server.base_url] = _Pool(loop, client, Slots(slots))
        return pool

    async def aclose(self) -> None:
        """Close the connection pools opened in the running event loop (the scheduler calls
        this when a run ends); pools of a finished loop are dropped."""
        loop = asyncio.get_running_loop()
        pools, self.pools = self.pools, {}
        for pool in pools.values():
            if pool.loop is loop:
                await pool.client.aclose()


async def _server_slots(client: Any, default: int) -> int:
    """The server's slot count from /props (`total_slots`), else `default`."""
    try:
        props = await client.props()
    except Exception:  # noqa: BLE001 - a server without /props keeps one slot at a time
        return default
    slots = props.get("total_slots") if isinstance(props, dict) else None
    return slots if isinstance(slots, int) and slots > 0 else default


def crashed_replies(server: Server, replies: list[Reply]) -> list[Reply]:
    """Errored replies of a server that crashed mid-request or hung are failing replies
    of kind server-crash / server-hang (the report is kept on `server.failure`); the next
    replay on it raises ArmFailed. Other errors stay errors."""
    errored = [r for r in replies if r.error]
    if not errored:
        return replies
    # A replay that stalled (no progress: "timeout") says more than one given up as slow.
    first = next((r for r in errored if "timeout" in r.kinds), errored[0])
    report = server.explain(first.error, timed_out="timeout" in first.kinds)
    if report is None:
        if not server.alive():
            raise ArmFailed(server.death_message(), server.log_tail())
        return replies
    return [crash_reply(r, report) if r.error else r for r in replies]


@dataclass
class LaunchEachTime:
    """Crash mode: every replay is a launch of `config` plus one request. A launch that
    dies of a signal is a failing reply (kind `server-crash`); a server that starts and
    answers is a passing one (the failure being diagnosed is the crash), its own findings
    kept as kinds. A launch that fails otherwise (bad flag) errors the arm."""

    config: Any  # ServerConfig
    log_dir: Any  # Path
    ready_timeout: float
    request: JsonObject
    seed: int
    timeout: float
    transform: Callable[[JsonObject], JsonObject]

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        replies = []
        for index in indices:  # one launch at a time: the machine has few cores
            replies.append(await asyncio.to_thread(self._one, arm, index))
        return replies

    def _one(self, arm: str, index: int) -> Reply:
        seed = self.seed + index
        started = time.monotonic()
        try:
            with open_server(
                self.config, self.log_dir / f"{arm}-{index}", self.ready_timeout
            ) as server:

                async def once() -> Reply:
                    client = llama_client.LlamaClient(
                        server.base_url, timeout=self.timeout, api_key=server.api_key
                    )
                    try:
                        body = probes.replay_body(self.transform(self.request), seed)
                        return await score_one(client, arm, body, index, seed, asyncio.Semaphore(1))
                    finally:
                        await client.aclose()

                reply = crashed_replies(server, [asyncio.run(once())])[0]
        except Exception as exc:  # noqa: BLE001 - a crash is a measurement, not an error
            crash = startup_crash(exc)
            if crash is None:
                raise ArmFailed(
                    f"{type(exc).__name__}: {str(exc)[:400]}", str(getattr(exc, "log_tail", ""))
                ) from exc
            return Reply(
                arm,
                index,
                seed,
                True,
                [CRASH_KIND, crash["signal"]],
                None,
                0,
                0,
                None,
                time.monotonic() - started,
                {},
                text=crash["log_tail"][-500:],
            )
        # It started: only a crash (at startup, mid-request), a hang or no answer fails.
        reply.failed = bool(reply.error) or bool({CRASH_KIND, HANG_KIND} & set(reply.kinds))
        return reply
