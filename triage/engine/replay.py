"""`replay_rate`: a failure rate measured by replaying recorded requests on the current
stack, decided against a baseline recorded earlier (revisits and bisection use it)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb.domain.records import Reply
from kb.jsontypes import JsonObject
from kb.repo.engine import data_dir
from triage import probes
from triage.engine.diagnosis import arm_summary
from triage.engine.replayer import score_one
from triage.engine.scheduler import ArmState
from triage.engine.servers import EngineError, Server, open_server
from triage.llama import client as llama_client
from triage.stackfile import Stack
from triage.stats import DEFAULT_CAP, compare, look_schedule

__all__ = ["ArmResult", "replay_rate"]


@dataclass
class ArmResult:
    """A failure rate measured by replaying requests, compared with a given baseline."""

    n: int
    failures: int
    rate: float | None
    ci95: list[float]
    p_value: float | None
    decision: str  # removes | unchanged | undecided | no-baseline-failure | errored
    kinds: dict[str, int] = field(default_factory=dict)
    error: str = ""
    speed_tok_s: float | None = None


@dataclass
class _RoundRobin:
    """Replay `i` sends body `i mod len(bodies)` with seed `seed + i`."""

    server: Server
    bodies: Sequence[dict[str, Any]]
    seed: int
    timeout: float

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        sem = asyncio.Semaphore(max(1, min(self.server.slots, 4)))
        client = llama_client.LlamaClient(
            self.server.base_url, timeout=self.timeout, api_key=self.server.api_key
        )
        try:
            tasks = [
                score_one(
                    client,
                    arm,
                    probes.replay_body(self.bodies[i % len(self.bodies)], self.seed + i),
                    i,
                    self.seed + i,
                    sem,
                )
                for i in indices
            ]
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()


def replay_rate(
    stack: Stack,
    request_bodies: list[JsonObject],
    *,
    max_requests: int = DEFAULT_CAP,
    baseline: tuple[int, int] | None = None,
    log_dir: Path | None = None,
    seed: int = 1000,
    request_timeout: float = 180.0,
) -> ArmResult:
    """Launch the stack's server, replay the requests (round robin, varied seeds) under the
    sequential rule against `baseline` = (failures, n) recorded earlier, and return the arm.
    Without a baseline the requests are replayed `max_requests` times and left undecided."""
    if not request_bodies:
        raise EngineError("replay_rate needs at least one request body")
    # Doubling looks: replay_rate compares with `compare` (the Bonferroni rule divides alpha
    # by the number of looks), so fewer looks keep its power.
    schedule = look_schedule(max_requests, doubling=True) if baseline else [max_requests]
    arm = ArmState("replay", "recorded requests on the current stack", "server", stack.server.key())
    try:
        with open_server(stack.server, log_dir or (data_dir() / "runs" / "replay"), 60.0) as server:
            replayer = _RoundRobin(server, request_bodies, seed, request_timeout)
            for target in schedule:
                todo = [i for i in range(arm.n, target)]
                arm.replies.extend(asyncio.run(replayer.replay(arm.name, todo)))
                if not server.alive():
                    arm.error = f"server died (log tail: {server.log_tail()[-500:]})"
                    break
                if baseline is None:
                    continue
                cmp = compare(baseline[0], baseline[1], arm.failures, arm.n, looks=len(schedule))
                arm.p_less, arm.p_value, arm.decision = cmp.p_less, cmp.p_two_sided, cmp.decision
                if cmp.decision in ("removes", "unchanged", "no-baseline-failure"):
                    break
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - a server that does not start is an errored arm
        arm.error = f"{type(exc).__name__}: {exc}"
    if baseline is None and not arm.error:
        arm.decision = "undecided"
    if arm.error and arm.n == 0:
        arm.decision = "errored"
    summary = arm_summary(arm)
    return ArmResult(
        n=arm.n,
        failures=arm.failures,
        rate=summary.rate,
        ci95=summary.ci95,
        p_value=arm.p_less if baseline else None,
        decision=arm.decision,
        kinds=arm.kind_counts(),
        error=arm.error,
        speed_tok_s=summary.speed_tok_s,
    )
