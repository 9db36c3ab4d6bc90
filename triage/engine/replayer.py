"""The production `Replayer`: replays through the llama client and scores each reply with
the capture + symptom layers. The only module of the engine that knows those APIs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kb.records import Reply
from triage import probes
from triage.causes import BASELINE
from triage.engine.scheduler import ArmFailed
from triage.engine.servers import Server
from triage.observe import committed_text, finish_reason_of, message_of, raw_misplaced

__all__ = ["ArmRoute", "LlamaReplayer", "classify_reply", "score_one"]


def classify_reply(
    request: dict[str, Any],
    status: int | None,
    body: Any,
    elapsed: float,
    *,
    timed_out: bool = False,
) -> tuple[bool, list[str]]:
    """Is this reply a failure, and which failure kinds does it show? (capture + symptoms)"""
    from triage.capture import CaptureError, exchange_from_http
    from triage.symptoms import USER_FACING_KINDS, failure_kinds

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
    return bool(kinds & USER_FACING_KINDS), sorted(kinds)


async def score_one(
    client: Any, arm: str, body: dict[str, Any], index: int, seed: int, sem: asyncio.Semaphore
) -> Reply:
    """Send one replicate and score it (failure kinds, lengths, timings)."""
    from triage.llama.client import LlamaClientError

    async with sem:
        started = time.monotonic()
        try:
            result = await client.chat(body)
        except LlamaClientError as exc:
            elapsed = time.monotonic() - started
            kind = "timeout" if getattr(exc, "kind", "") == "timeout" else "http-error"
            return Reply(
                arm, index, seed, True, [kind], None, 0, 0, None, elapsed, {}, error=str(exc)
            )
    payload = result.json
    failed, kinds = classify_reply(
        body, result.status_code, payload if payload is not None else result.raw, result.elapsed
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


@dataclass
class ArmRoute:
    """Where an arm's replays go and how its request is varied."""

    server: Server
    transform: Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class LlamaReplayer:
    """Replays `request` (through each arm's transform) on each arm's server."""

    request: dict[str, Any]
    seed: int
    timeout: float
    concurrency: int | None = None
    routes: dict[str, ArmRoute] = field(default_factory=dict)

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        from triage.llama.client import LlamaClient

        route = self.routes[arm]
        server = route.server
        if not server.alive():
            raise ArmFailed(server.death_message(), server.log_tail())
        slots = self.concurrency or max(1, min(server.slots, 4))
        sem = asyncio.Semaphore(slots)
        client = LlamaClient(server.base_url, timeout=self.timeout, api_key=server.api_key)
        try:
            tasks = []
            for index in indices:
                seed = self.seed + index
                body = probes.replay_body(route.transform(self.request), seed)
                tasks.append(score_one(client, arm, body, index, seed, sem))
            replies = list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()
        replies = crashed_replies(server, replies)
        if server.failure is not None and arm != BASELINE:
            # The shared server crashed (or hung) under another arm's variant: a crash is
            # not this arm's measurement of the captured failure, so the arm errors.
            raise ArmFailed(server.death_message(), server.log_tail())
        return replies


def crashed_replies(server: Server, replies: list[Reply]) -> list[Reply]:
    """Errored replies of a server that crashed mid-request or hung are failing replies
    of kind server-crash / server-hang (the report is kept on `server.failure`); the next
    replay on it raises ArmFailed. Other errors stay errors."""
    from triage.engine.crashes import crash_reply

    errored = [r for r in replies if r.error]
    if not errored:
        return replies
    report = server.explain(errored[0].error, timed_out="timeout" in errored[0].kinds)
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
    request: dict[str, Any]
    seed: int
    timeout: float
    transform: Callable[[dict[str, Any]], dict[str, Any]]

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        replies = []
        for index in indices:  # one launch at a time: the machine has few cores
            replies.append(await asyncio.to_thread(self._one, arm, index))
        return replies

    def _one(self, arm: str, index: int) -> Reply:
        from triage.engine.crashes import CRASH_KIND, HANG_KIND, startup_crash
        from triage.engine.servers import open_server
        from triage.llama.client import LlamaClient

        seed = self.seed + index
        started = time.monotonic()
        try:
            with open_server(
                self.config, self.log_dir / f"{arm}-{index}", self.ready_timeout
            ) as server:

                async def once() -> Reply:
                    client = LlamaClient(
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
