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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.domain.diagnosis import Reproduction, ReproductionSignature, SkippedArm
from kb.domain.records import Reply
from kb.jsontypes import JsonObject
from kb.repo import runs
from triage import probes
from triage.causes import BASELINE, reproduces
from triage.engine import known_good
from triage.engine.backend import Backend
from triage.engine.crashes import CRASH_KIND, crash_facts
from triage.engine.decide import Execution, Rules
from triage.engine.events import ArmSkipped, ProgressEvent
from triage.engine.held_back import not_needed
from triage.engine.launches import LaunchPool
from triage.engine.pacing import ServerPace
from triage.engine.plan import Plan
from triage.engine.progress import ExecuteOptions, Journal, Progress
from triage.engine.recorder import Recorder
from triage.engine.replayer import ArmRoute
from triage.engine.reproduction import Signature, gate_message
from triage.engine.rounds import Rounds, safe_name
from triage.engine.scheduler import ArmState, Replayer
from triage.engine.servers import EngineError, Server, check_config, gateway_server

__all__ = ["Executor", "gate", "note_failures"]


class Executor:
    """Runs one plan against the incident's server (None: it crashed at startup)."""

    def __init__(
        self,
        plan: Plan,
        *,
        exchange: JsonObject,
        signature: Signature,
        options: ExecuteOptions,
        backend: Backend,
        recorder: Recorder,
        progress: Progress,
        secrets: list[str],
        crash: dict[str, Any] | None = None,
    ) -> None:
        self.exchange = exchange
        self.signature = signature
        self.options = options
        self.backend = backend
        self.replayer = backend.replayer(plan.request, options.replay)
        self.recorder = recorder
        self.progress = progress
        self.execution = Execution(plan, self._states(plan), crash=crash)
        progress.execution = self.execution
        self.rules = Rules(self.execution)
        self.rounds = Rounds(
            self.execution,
            options,
            self.replayer,
            backend,
            self.rules,
            Journal(recorder, secrets, progress, self.execution),
            progress,
            exchange,
        )

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

    # -- the run -----------------------------------------------------------------------------
    async def run(self, base: Server | None, log_dir: Path) -> Execution:
        if base is None:
            await self._crash_mode(log_dir)
        else:
            await self._run_arms(base, log_dir)
        _stop_if_interrupted()
        return self.execution

    async def _run_arms(self, base: Server, log_dir: Path) -> None:
        run = self.execution
        if base.pace is None and self.options.pace is not None:
            # The observation requests measure the server's speed first (pacing).
            base.pace = ServerPace(self.options.pace)
        await self.backend.observe(base, self.plan.request, run.facts, self.options.replay)
        for planned in self.plan.observe_only:
            await self.rounds.observe(planned, base, base)
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
        rounds = self.rounds.server_rounds()
        with LaunchPool(log_dir, self.options.ready_timeout, opener=self.backend.launch) as pool:
            # The first round's servers start now, while the baseline and the request-level
            # arms replay on the incident's server; none replays before the gate passed.
            self.rounds.start_round(pool, rounds[0] if rounds else [])
            if not await self._reproduce(self.replayer):
                return
            _stop_if_interrupted()
            crashed = _base_failed(base)  # the baseline's replays crashed or hung it
            if not crashed:
                # One run: the request-level arms and the first round's server-level arms,
                # each joining as soon as its server is up, all busy at the same time.
                first = rounds[0] if rounds else []
                await self.rounds.run_round(pool, first, base, [p.name for p in request_arms])
                _stop_if_interrupted()
                for names in rounds[1:]:
                    self.rounds.start_round(pool, names)
                    await self.rounds.run_round(pool, names, base)
                    _stop_if_interrupted()
                await self._run_held_back(pool, base)
        if crashed:
            await self._crash_mode_after(base, log_dir)
            return
        if self.plan.known_good:
            await self._known_good(base, log_dir)

    async def _run_held_back(self, pool: LaunchPool, base: Server) -> None:
        """The held-back arms (request-field ablation), only when the baseline reproduced
        and no cause is confirmed after every other arm; else each is listed as skipped."""
        plan = self.plan
        if not plan.held_back:
            return
        outcomes = {n: a.outcome() for n, a in self.arms.items()}
        why = not_needed(self.rules.verdicts(outcomes), reproduces(outcomes))
        if why is not None or _base_failed(base):
            why = why or "the incident's server crashed or hung"
            skipped = [*plan.skipped, *(SkippedArm(p.name, why) for p in plan.held_back)]
            self.execution.plan = dataclasses.replace(plan, skipped=tuple(skipped))
            return
        previous = self.recorder.previous_replies()
        for planned in plan.held_back:
            arm = ArmState(planned.name, planned.variant, "request", base.key, planned.decides)
            arm.replies = [r for r in previous if r.arm == planned.name and not r.error]
            arm.launch_seconds = base.launch_seconds
            self.arms[planned.name] = arm
            self.replayer.routes[planned.name] = ArmRoute(base, planned.transform)
        held = {p.name: p for p in plan.held_back}
        self.execution.plan = dataclasses.replace(plan, arms={**plan.arms, **held})
        self.progress.emit(
            ProgressEvent("plan", "no cause confirmed: request-field ablation: " + ", ".join(held))
        )
        await self.rounds.run_round(pool, [], base, list(held))

    def _skip_unmet(self) -> None:
        """Drop the arms whose precondition the observations refute (e.g. thinking-off when
        the template render shows no thinking for the request): they cannot matter. An arm
        with replies already recorded (a resumed run) keeps them and stays."""
        if not self.options.check_preconditions:
            return  # every planned arm runs (to measure what the preconditions save)
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
            if outcome.config is None:
                raise EngineError(f"arm {name}: configured without a server configuration")
            check_config(outcome.config, f"arm {name}")
            arms[name] = outcome
            self.arms[name].group = outcome.config.key()
            self.arms[name].variant = outcome.variant
        self.execution.plan = dataclasses.replace(plan, arms=arms, skipped=tuple(skipped))

    def _drop(
        self, arms: dict[str, probes.PlannedArm], skipped: list[SkippedArm], name: str, why: str
    ) -> None:
        del arms[name], self.arms[name]
        skipped.append(SkippedArm(name, why))
        self.progress.emit(ArmSkipped(name, why))

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
            with LaunchPool(
                log_dir, self.options.ready_timeout, opener=self.backend.launch
            ) as pool:
                self.rounds.start_round(pool, [step.name])
                await self.rounds.run_round(pool, [step.name], base)
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
            self.execution.reproduction = Reproduction(
                True, str(crash["summary"]), ReproductionSignature([CRASH_KIND])
            )
        router = _Router()
        stack = self.plan.stack
        for name, planned in self.plan.arms.items():
            config = stack.server if name == BASELINE else planned.config
            assert config is not None
            router.routes[name] = self.backend.launch_each_time(
                config,
                log_dir / safe_name(name),
                self.plan.request,
                planned.transform,
                self.options.replay,
            )
        if not await self._reproduce(router, gate=not startup):
            return
        for planned in self.plan.server_arms:
            self.progress.emit(ProgressEvent("launch", f"launching {planned.name} once per replay"))
            await self.rounds.scheduler().run(self.arms, [planned.name], router)

    # -- the reproduction gate ----------------------------------------------------------------
    async def _reproduce(self, replayer: Replayer, gate: bool = True) -> bool:
        """The reproduction gate: the baseline's first look must show the captured failure
        signature; otherwise no arm runs and no cause moves."""
        await self.rounds.scheduler().baseline_look(self.arms, self.options.schedule[0], replayer)
        return self._gate() if gate else True

    def _gate(self) -> bool:
        """Apply the reproduction gate to the baseline's replies so far."""
        reproduction = self.execution.reproduction = gate(self.signature, self.arms)
        if not reproduction.reproduced:
            self.progress.emit(ProgressEvent("gate", reproduction.message))
        return reproduction.reproduced

    # -- servers and observations -------------------------------------------------------------


def _base_failed(base: Server) -> bool:
    """The incident's own server crashed mid-request or hung (its CrashReport kept)."""
    if base.failure is None and base.handle is not None and not base.alive():
        base.failure = base.crash_report()
    return base.failure is not None


@dataclass
class _Router:
    """A Replayer that sends each arm to its own replayer (crash mode: a launch per replay)."""

    routes: dict[str, Replayer] = dataclasses.field(default_factory=dict)

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        return list(await self.routes[arm].replay(arm, indices))


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


def gate(signature: Signature, arms: dict[str, ArmState]) -> Reproduction:
    """The reproduction gate over the baseline's replies so far: the baseline must show the
    captured failure signature; otherwise no other arm runs."""
    message = gate_message(signature, arms[BASELINE])
    if message is not None:
        for arm in arms.values():
            if arm.name != BASELINE:
                arm.stopped = "not run: the failure did not reproduce"
    return Reproduction(
        message is None,
        message or "the baseline reproduces the captured failure",
        signature.facts(),
    )


def _stop_if_interrupted() -> None:
    """A Ctrl-C cancels the run's task (asyncio.run's SIGINT handler). A library that
    swallowed that cancellation on its way (httpx closes connections under shielded cancel
    scopes) would let the run go on and finish as if nothing happened; the task still counts
    the request (`cancelling()`), so the run stops at the next step and asyncio.run turns
    it into the KeyboardInterrupt the runner records as an interrupted, resumable run."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
