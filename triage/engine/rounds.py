"""How arms run: a scheduler run over a set of arms (the cause rules judge, the journal
stores the replies, the looks are announced as events); server-level arms' servers
started in rounds that fit in memory, each arm joining its run once its server is up and
observed. Used by the executor (triage.engine.execute) for every phase."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from triage import probes
from triage.engine.backend import ArmReplayer, Backend
from triage.engine.crashes import crash_facts, report_of
from triage.engine.decide import Execution, Rules
from triage.engine.events import LookStarted, ProgressEvent
from triage.engine.launches import LaunchPool, launch_rounds, memory_available
from triage.engine.progress import ExecuteOptions, Journal, Progress
from triage.engine.replayer import ArmRoute
from triage.engine.scheduler import ArmState, Scheduler
from triage.engine.servers import Server, gateway_server

__all__ = ["Rounds", "mark_died", "observe_arm", "safe_name"]


@dataclass
class Rounds:
    """Runs arms for the executor: the scheduler, the arms' servers, their observations."""

    execution: Execution
    options: ExecuteOptions
    replayer: ArmReplayer
    backend: Backend
    rules: Rules
    journal: Journal
    progress: Progress
    exchange: dict[str, Any]

    def scheduler(self) -> Scheduler:
        looks = len(self.options.schedule)

        def on_look(look: int, target: int, active: list[str]) -> None:
            self.progress.emit(LookStarted(look + 1, looks, target, tuple(active)))

        return Scheduler(
            list(self.options.schedule),
            self.options.max_requests,
            judge=self.rules,
            on_replies=self.journal.write,
            on_look=on_look,
        )

    def server_rounds(self) -> list[list[str]]:
        """The server-level arms still to run, in rounds whose servers fit in memory together
        (launches.launch_rounds)."""
        todo = [
            (planned.name, planned.config)
            for planned in self.execution.plan.server_arms
            if planned.config is not None
            and self.execution.arms[planned.name].decision in ("not-run", "undecided")
            and not self.execution.arms[planned.name].error
        ]
        return launch_rounds(todo, memory_available())

    def start_round(self, pool: LaunchPool, names: Sequence[str]) -> None:
        for name in names:
            config = self.execution.plan.arms[name].config
            assert config is not None
            self.progress.emit(ProgressEvent("launch", f"starting server for {name}"))
            pool.start(name, config, safe_name(name))

    async def run_round(
        self, pool: LaunchPool, names: Sequence[str], base: Server, request: Sequence[str] = ()
    ) -> None:
        """One scheduler run of the `request` arms and of the server-level arms `names`
        (started in `pool`), each joining when its server is up; an arm whose server failed
        to start is errored. Their servers are stopped when the run ends."""
        joining = {name: self.join(pool, name, base) for name in names}
        try:
            if request or names:
                await self.scheduler().run(
                    self.execution.arms, [*request, *names], self.replayer, joining
                )
        finally:
            for name in names:
                pool.launches[name].stop()

    async def join(self, pool: LaunchPool, name: str, base: Server) -> bool:
        """Wait for the arm's server, observe it (the arm's hook), route the arm to it."""
        planned, arm = self.execution.plan.arms[name], self.execution.arms[name]
        try:
            server = await asyncio.wrap_future(pool.launches[name].future)
            arm.launch_seconds = server.launch_seconds
            self.execution.servers[server.key] = server
            if planned.observe is not None:
                await self.observe(planned, base, server)
            self.replayer.routes[name] = ArmRoute(server, planned.transform)
        except Exception as exc:  # noqa: BLE001 - a failed launch is an errored arm
            mark_died(arm, exc, self.execution.facts)
            return False
        return True

    async def observe(self, planned: probes.PlannedArm, base: Server, server: Server) -> None:
        context = probes.ObserveContext(
            base,
            server,
            self.execution.plan.request,
            self.options.seed,
            self.options.request_timeout,
            self.options.divergence_seeds,
            exchange=self.exchange or None,
            client_side=gateway_server(self.execution.plan.stack, base),
        )
        facts = await observe_arm(self.backend, planned, context)
        if facts:
            self.execution.facts[str(facts["name"])] = facts


def safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def mark_died(arm: ArmState, exc: BaseException, facts: dict[str, dict[str, Any]]) -> None:
    """An arm whose server failed to start (or died) is errored; its CrashReport, when
    the launcher has one, is the error's text and an observation of its own."""
    report = report_of(exc)
    if report is not None:
        crash = crash_facts(report)
        name = f"{arm.name}-{crash['name']}"
        facts[name] = {**crash, "name": name, "arm": arm.name}
    if not arm.error:
        arm.error = report.sentence() if report is not None else f"{type(exc).__name__}: {exc}"
        arm.log_tail = str(getattr(exc, "log_tail", ""))
        arm.decision = "errored"
        arm.stopped = "server failed"


async def observe_arm(
    backend: Backend, planned: probes.PlannedArm, context: probes.ObserveContext
) -> dict[str, Any] | None:
    """The arm's observation hook's facts (named after the arm); a hook that fails is
    recorded as an observation with its error, not fatal."""
    assert planned.observe is not None
    facts: dict[str, Any] | None
    try:
        facts = await backend.observe_arm(planned, context)
    except Exception as exc:  # noqa: BLE001 - an observation is recorded, not fatal
        facts = {"name": f"{planned.name}-observation", "error": f"{type(exc).__name__}: {exc}"}
    return {"name": planned.name, **facts} if facts else None
