"""Step 2 of a diagnosis: run the plan -- one event loop, one `asyncio.run`.

One launch per distinct server configuration; request-level arms share the incident's
server and run concurrently up to its slots. Server-level arms' servers start in the
background while the baseline and the request-level arms replay (triage.engine.launches),
and each such arm joins the same scheduler run as soon as its server is up, so every server
is busy at once; none replays before the reproduction gate passed. Every reply is stored
as evidence as soon as its look completes (the `Journal`, one transaction per look), so an
interrupted run leaves the KB consistent and `--resume` continues from the replies already
recorded. A server that crashes (at startup, mid-request) or hangs turns the run into crash
mode: every replay is a launch, and the failure compared across arms is the crash.

Data walks down: the scheduler gets the cause rules (`Rules`), the journal and the progress
sink; the known-good search says which configuration to run next. Nothing calls back up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.domain.records import Reply
from kb.repo import runs
from triage import observe, probes
from triage.causes import BASELINE
from triage.engine import known_good
from triage.engine.crashes import CRASH_KIND, crash_facts, report_of
from triage.engine.decide import Execution, Rules
from triage.engine.eta import eta_bound
from triage.engine.events import ArmSkipped, Event, LookStarted, ProgressEvent, RepliesIn
from triage.engine.launches import LaunchPool, launch_rounds, memory_available
from triage.engine.plan import Plan, Skipped
from triage.engine.recorder import Recorder
from triage.engine.replayer import ArmRoute, LaunchEachTime, LlamaReplayer
from triage.engine.reproduction import Signature, gate_message
from triage.engine.scheduler import ArmState, Replayer, Scheduler
from triage.engine.servers import Server, check_config, gateway_server, scrub_secrets

__all__ = [
    "ExecuteOptions",
    "Executor",
    "Progress",
    "gate",
    "mark_died",
    "note_failures",
    "observe_arm",
]

QUIET_SECONDS = 30.0  # a progress line at least this often while replies come in


@dataclass(frozen=True)
class ExecuteOptions:
    """What the executor needs of DiagnoseOptions."""

    max_requests: int
    seed: int
    concurrency: int | None
    request_timeout: float
    ready_timeout: float
    divergence_seeds: int
    schedule: tuple[int, ...]


class Progress:
    """The progress sink: every event also beats the run's heartbeat (a run that stops
    beating is taken as abandoned); probe events carry the bound on the time left."""

    def __init__(self, fn: Callable[[Event], None], recorder: Recorder, options: ExecuteOptions):
        self.fn = fn
        self.recorder = recorder
        self.options = options
        self.execution: Execution | None = None
        self.last_emit = time.monotonic()

    def emit(self, event: Event) -> None:
        self.recorder.heartbeat()
        self.last_emit = time.monotonic()
        if isinstance(event, LookStarted | RepliesIn):
            event = dataclasses.replace(event, eta=self._eta())
        self.fn(event)

    def _eta(self) -> float | None:
        """The bound on the time left: replays still possible x measured time per replay /
        the replays each server runs at once."""
        if self.execution is None:
            return None
        slots = {
            key: self.options.concurrency or max(1, min(server.slots, 4))
            for key, server in self.execution.servers.items()
        }
        bound = eta_bound(self.execution.arms.values(), self.options.max_requests, slots)
        return None if bound is None else bound.seconds


@dataclass
class Journal:
    """Stores each look's replies as they come in, their error text scrubbed of secret flag
    values (a failed launch quotes its argv); says what came in when a server is slow."""

    recorder: Recorder
    secrets: list[str]
    progress: Progress
    execution: Execution

    def write(self, replies: Sequence[Reply]) -> None:
        if self.secrets:
            replies = [
                dataclasses.replace(r, error=scrub_secrets(r.error, self.secrets)) if r.error else r
                for r in replies
            ]
        self.recorder.record_replies(replies)
        if replies and time.monotonic() - self.progress.last_emit >= QUIET_SECONDS:
            arm = self.execution.arms.get(replies[0].arm)
            if arm is not None:
                self.progress.emit(
                    RepliesIn(arm.name, len(arm.replies), arm.failures, len(arm.replies) - arm.n)
                )


class Executor:
    """Runs one plan against the incident's server (None: it crashed at startup)."""

    def __init__(
        self,
        plan: Plan,
        *,
        exchange: dict[str, Any],
        signature: Signature,
        options: ExecuteOptions,
        replayer: LlamaReplayer,
        recorder: Recorder,
        progress: Progress,
        secrets: list[str],
        crash: dict[str, Any] | None = None,
    ) -> None:
        self.exchange = exchange
        self.signature = signature
        self.options = options
        self.replayer = replayer
        self.recorder = recorder
        self.progress = progress
        self.execution = Execution(plan, self._states(plan), crash=crash)
        progress.execution = self.execution
        self.journal = Journal(recorder, secrets, progress, self.execution)
        self.rules = Rules(self.execution)

    @property
    def plan(self) -> Plan:
        return self.execution.plan

    @property
    def arms(self) -> dict[str, ArmState]:
        return self.execution.arms

    def _states(self, plan: Plan) -> dict[str, ArmState]:
        """Fresh arm states with the replies a resumed run already recorded."""
        arms = plan.states()
        for reply in self.recorder.previous_replies():
            arm = arms.get(reply.arm)
            # A replay that ended without an answer (timeout, HTTP failure) is replayed
            # again on resume; its errored reply stays in the evidence.
            if arm is not None and not reply.error and not arm.has(reply.index):
                arm.replies.append(reply)
        return arms

    def _scheduler(self) -> Scheduler:
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

    # -- the run -----------------------------------------------------------------------------
    async def run(self, base: Server | None, log_dir: Path) -> Execution:
        if base is None:
            await self._crash_mode(log_dir)
        else:
            await self._run_arms(base, log_dir)
        return self.execution

    async def _run_arms(self, base: Server, log_dir: Path) -> None:
        run = self.execution
        await observe.observe_server(
            base,
            self.plan.request,
            run.facts,
            seed=self.options.seed,
            timeout=self.options.request_timeout,
        )
        for planned in self.plan.observe_only:
            await self._observe(planned, base, base)
        if _base_failed(base):  # it crashed (or hung) on the observation requests
            await self._crash_mode_after(base, log_dir)
            return
        self._skip_unmet()
        self._configure()
        request_arms = self.plan.request_arms
        client_side = gateway_server(self.plan.stack, base)  # what the client used
        for planned in request_arms:
            self.arms[planned.name].launch_seconds = base.launch_seconds
            target = base if planned.endpoint == "server" else client_side
            self.replayer.routes[planned.name] = ArmRoute(
                target, planned.transform, stream=planned.stream
            )
        rounds = self._server_rounds()
        with LaunchPool(log_dir, self.options.ready_timeout) as pool:
            # The first round's servers start now, while the baseline and the request-level
            # arms replay on the incident's server; none replays before the gate passed.
            self._start_round(pool, rounds[0] if rounds else [])
            if not await self._reproduce(self.replayer):
                return
            crashed = _base_failed(base)  # the baseline's replays crashed or hung it
            if not crashed:
                # One run: the request-level arms and the first round's server-level arms,
                # each joining as soon as its server is up, all busy at the same time.
                first = rounds[0] if rounds else []
                await self._run_round(pool, first, base, [p.name for p in request_arms])
                for names in rounds[1:]:
                    self._start_round(pool, names)
                    await self._run_round(pool, names, base)
        if crashed:
            await self._crash_mode_after(base, log_dir)
            return
        if self.plan.known_good:
            await self._known_good(base, log_dir)

    def _skip_unmet(self) -> None:
        """Drop the arms whose precondition the observations refute (e.g. thinking-off when
        the template render shows no thinking for the request): they cannot matter. An arm
        with replies already recorded (a resumed run) keeps them and stays."""
        plan = self.plan
        arms, skipped = dict(plan.arms), list(plan.skipped)
        for name, planned in plan.arms.items():
            if name == BASELINE or planned.requires is None or self.arms[name].replies:
                continue
            why = planned.requires(self.execution.facts, self.exchange or None)
            if why is not None:
                self._drop(arms, skipped, name, why)
        self.execution.plan = dataclasses.replace(plan, arms=arms, skipped=tuple(skipped))

    def _configure(self) -> None:
        """Server-level arms whose launch depends on the observations (PlannedArm.configure,
        e.g. -ub from the measured input tokens): launched as configured, or skipped."""
        plan = self.plan
        arms, skipped = dict(plan.arms), list(plan.skipped)
        for name, planned in plan.arms.items():
            if planned.configure is None:
                continue
            outcome = planned.configure(self.execution.facts)
            if isinstance(outcome, str):
                if not self.arms[name].replies:  # a resumed run keeps what it recorded
                    self._drop(arms, skipped, name, outcome)
                continue
            check_config(outcome, f"arm {name}")
            arms[name] = dataclasses.replace(planned, config=outcome)
            self.arms[name].group = outcome.key()
        self.execution.plan = dataclasses.replace(plan, arms=arms, skipped=tuple(skipped))

    def _drop(
        self, arms: dict[str, probes.PlannedArm], skipped: list[Skipped], name: str, why: str
    ) -> None:
        del arms[name], self.arms[name]
        skipped.append(Skipped(name, why))
        self.progress.emit(ArmSkipped(name, why))

    def _server_rounds(self) -> list[list[str]]:
        """The server-level arms still to run, in rounds whose servers fit in memory together
        (launches.launch_rounds)."""
        todo = [
            (planned.name, planned.config)
            for planned in self.plan.server_arms
            if planned.config is not None
            and self.arms[planned.name].decision in ("not-run", "undecided")
            and not self.arms[planned.name].error
        ]
        return launch_rounds(todo, memory_available())

    def _start_round(self, pool: LaunchPool, names: Sequence[str]) -> None:
        for name in names:
            config = self.plan.arms[name].config
            assert config is not None
            self.progress.emit(ProgressEvent("launch", f"starting server for {name}"))
            pool.start(name, config, _safe(name))

    async def _run_round(
        self, pool: LaunchPool, names: Sequence[str], base: Server, request: Sequence[str] = ()
    ) -> None:
        """One scheduler run of the `request` arms and of the server-level arms `names`
        (started in `pool`), each joining when its server is up; an arm whose server failed
        to start is errored. Their servers are stopped when the run ends."""
        joining = {name: self._join(pool, name, base) for name in names}
        try:
            if request or names:
                await self._scheduler().run(self.arms, [*request, *names], self.replayer, joining)
        finally:
            for name in names:
                pool.launches[name].stop()

    async def _join(self, pool: LaunchPool, name: str, base: Server) -> bool:
        """Wait for the arm's server, observe it (the arm's hook), route the arm to it."""
        planned, arm = self.plan.arms[name], self.arms[name]
        try:
            server = await asyncio.wrap_future(pool.launches[name].future)
            arm.launch_seconds = server.launch_seconds
            self.execution.servers[server.key] = server
            if planned.observe is not None:
                await self._observe(planned, base, server)
            self.replayer.routes[name] = ArmRoute(server, planned.transform)
        except Exception as exc:  # noqa: BLE001 - a failed launch is an errored arm
            mark_died(arm, exc, self.execution.facts)
            return False
        return True

    async def _known_good(self, base: Server, log_dir: Path) -> None:
        """Delta debugging towards the known-good configuration, one arm at a time, each
        decided like any server-level arm (triage.engine.known_good says which is next)."""
        dims, decisions = self.plan.known_good, dict[str, str]()
        while (step := known_good.next_arm(dims, decisions)) is not None:
            config = step.config(self.plan.stack)
            self.arms[step.name] = ArmState(step.name, step.variant, "server", config.key())
            planned = probes.PlannedArm(step.name, step.variant, "server", config=config)
            self.execution.plan = dataclasses.replace(
                self.plan, arms={**self.plan.arms, step.name: planned}
            )
            with LaunchPool(log_dir, self.options.ready_timeout) as pool:
                self._start_round(pool, [step.name])
                await self._run_round(pool, [step.name], base)
            decisions[step.name] = self.arms[step.name].decision
        self.execution.facts["known-good-search"] = known_good.result(dims, decisions)

    # -- crash mode ---------------------------------------------------------------------------
    async def _crash_mode_after(self, base: Server, log_dir: Path) -> None:
        """The incident's server started but crashed mid-request or hung: the crash is the
        failure to diagnose (issue 12), probed like a startup crash -- every replay is a
        launch plus one request -- by the crash-only arms (no-repack, ...)."""
        crash = self.execution.crash = crash_facts(base.failure)
        self.progress.emit(
            ProgressEvent(
                "crash", crash["summary"] + "; diagnosing the crash, one launch per replay"
            )
        )
        plan = self.plan.for_crash()
        # The crash-only causes (cpu-backend) join the incident's causes.
        self.recorder.ensure_causes([runs.CauseSpec(c.id, c.title) for c in plan.causes])
        # crash-only server arms; the baseline keeps its recorded replies
        self.execution.plan, self.execution.arms = plan, self._states(plan)
        await self._crash_mode(log_dir)

    async def _crash_mode(self, log_dir: Path) -> None:
        """The incident's server crashes (at startup, mid-request) or hangs: every replay of
        the baseline and of each server-level arm is a launch (plus one request when it
        starts), and the failure compared across arms is the crash."""
        crash = self.execution.crash
        assert crash is not None
        self.execution.facts[str(crash["name"])] = crash
        startup = crash.get("phase", "startup") == "startup"
        if startup:
            self.execution.reproduction = {
                "reproduced": True,
                "message": crash["summary"],
                "signature": {"kinds": [CRASH_KIND], "finish_reason": None, "status_class": None},
            }
        router = _Router()
        stack = self.plan.stack
        for name, planned in self.plan.arms.items():
            config = stack.server if name == BASELINE else planned.config
            router.routes[name] = LaunchEachTime(
                config,
                log_dir / _safe(name),
                self.options.ready_timeout,
                self.plan.request,
                self.options.seed,
                self.options.request_timeout,
                planned.transform,
            )
        if not await self._reproduce(router, gate=not startup):
            return
        for planned in self.plan.server_arms:
            self.progress.emit(ProgressEvent("launch", f"launching {planned.name} once per replay"))
            await self._scheduler().run(self.arms, [planned.name], router)

    # -- the reproduction gate ----------------------------------------------------------------
    async def _reproduce(self, replayer: Replayer, gate: bool = True) -> bool:
        """The reproduction gate: the baseline's first look must show the captured failure
        signature; otherwise no arm runs and no cause moves."""
        await self._scheduler().baseline_look(self.arms, self.options.schedule[0], replayer)
        return self._gate() if gate else True

    def _gate(self) -> bool:
        """Apply the reproduction gate to the baseline's replies so far."""
        reproduction = self.execution.reproduction = gate(self.signature, self.arms)
        if not reproduction["reproduced"]:
            self.progress.emit(ProgressEvent("gate", str(reproduction["message"])))
        return bool(reproduction["reproduced"])

    # -- servers and observations -------------------------------------------------------------
    async def _observe(self, planned: probes.PlannedArm, base: Server, server: Server) -> None:
        context = probes.ObserveContext(
            base,
            server,
            self.plan.request,
            self.options.seed,
            self.options.request_timeout,
            self.options.divergence_seeds,
            exchange=self.exchange or None,
            client_side=gateway_server(self.plan.stack, base),
        )
        facts = await observe_arm(planned, context)
        if facts:
            self.execution.facts[str(facts["name"])] = facts


def _base_failed(base: Server) -> bool:
    """The incident's own server crashed mid-request or hung (its CrashReport kept)."""
    if base.failure is None and base.handle is not None and not base.alive():
        base.failure = base.crash_report()
    return base.failure is not None


@dataclass
class _Router:
    """A Replayer that sends each arm to its own replayer (crash mode: a launch per replay)."""

    routes: dict[str, LaunchEachTime] = dataclasses.field(default_factory=dict)

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        return list(await self.routes[arm].replay(arm, indices))


def _safe(name: str) -> str:
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


def note_failures(execution: Execution) -> None:
    """Each server that crashed mid-request or hung: its CrashReport as an observation
    (signal, backtrace symbol, CPU flags, log tail, the report's sentence)."""
    for server in execution.servers.values():
        if server.failure is None:
            continue
        facts = crash_facts(server.failure)
        arms = sorted(a.name for a in execution.arms.values() if a.group == server.key)
        name = (
            facts["name"]
            if server.config is execution.plan.stack.server
            else f"{'+'.join(arms) or server.key}-{facts['name']}"
        )
        execution.facts[name] = {**facts, "name": name, "arms": arms}


def gate(signature: Signature, arms: dict[str, ArmState]) -> dict[str, Any]:
    """The reproduction gate over the baseline's replies so far: the baseline must show the
    captured failure signature; otherwise no other arm runs."""
    message = gate_message(signature, arms[BASELINE])
    if message is not None:
        for arm in arms.values():
            if arm.name != BASELINE:
                arm.stopped = "not run: the failure did not reproduce"
    return {
        "reproduced": message is None,
        "message": message or "the baseline reproduces the captured failure",
        "signature": signature.to_dict(),
    }


async def observe_arm(
    planned: probes.PlannedArm, context: probes.ObserveContext
) -> dict[str, Any] | None:
    """The arm's observation hook's facts (named after the arm); a hook that fails is
    recorded as an observation with its error, not fatal."""
    assert planned.observe is not None
    facts: dict[str, Any] | None
    try:
        facts = await planned.observe(context)
    except Exception as exc:  # noqa: BLE001 - an observation is recorded, not fatal
        facts = {"name": f"{planned.name}-observation", "error": f"{type(exc).__name__}: {exc}"}
    return {"name": planned.name, **facts} if facts else None
