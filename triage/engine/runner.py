"""One diagnosis run: plan -> run -> record -> decide -> Diagnosis.

One launch per distinct server configuration; request-level arms share the incident's
server and run concurrently up to its slots. Server-level arms' servers start in the
background while the baseline and the request-level arms replay (triage.engine.launches),
and each such arm joins the same scheduler run as soon as its server is up, so every server
is busy at once; none replays before the reproduction gate passed. Every reply is stored
as evidence as soon as its look completes (one transaction per look), so an interrupted
run leaves the KB consistent and `--resume` continues from the replies already recorded.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb.domain.records import Reply
from kb.repo import runs
from kb.repo.engine import data_dir
from kb.repo.store import Store
from triage import causes as cause_rules
from triage import graph as graph_mod
from triage import observe, probes
from triage.engine import known_good, resuming
from triage.engine.crashes import CRASH_KIND, crash_facts, report_of, startup_crash
from triage.engine.diagnosis import arm_summary, build_diagnosis, server_seconds, stack_summary
from triage.engine.eta import eta_bound
from triage.engine.events import (
    ArmSkipped,
    ArmsPlanned,
    Event,
    LookStarted,
    ProgressEvent,
    ProgressFn,
    RepliesIn,
)
from triage.engine.held_back import is_held_back, not_needed
from triage.engine.launches import LaunchPool, launch_rounds, memory_available
from triage.engine.naming import (
    ModelIdentity,
    identity_from_file,
    url_model_identity,
)
from triage.engine.pacing import PaceOptions, ServerPace
from triage.engine.replayer import ArmRoute, LaunchEachTime, LlamaReplayer
from triage.engine.reproduction import Signature, gate_message
from triage.engine.scheduler import ArmState, Scheduler, no_replies
from triage.engine.servers import (
    EngineError,
    Server,
    api_key_from_args,
    check_config,
    check_gateway,
    check_url,
    gateway_server,
    open_server,
    safe_args,
    safe_describe,
    safe_stack_raw,
    scrub_secrets,
    secret_values,
)
from triage.llama.endpoints import body_problem
from triage.llama.model_lint import lint_findings
from triage.stackfile import ServerConfig, Stack
from triage.stats import DEFAULT_CAP, look_schedule

__all__ = ["ACTOR", "DiagnoseOptions", "Diagnoser"]

ACTOR = "engine"
QUIET_SECONDS = 30.0  # a progress line at least this often while replies come in


@dataclass
class DiagnoseOptions:
    max_requests: int = DEFAULT_CAP  # per arm
    seed: int = 1000
    concurrency: int | None = None  # default: the server's slots, at most 4
    # Replay time limits (triage.engine.pacing): `request_timeout` until the server's speed
    # is measured, then SAFETY x the measured time of the requested tokens, within
    # [replay_floor, replay_cap]; past it a replay is waited for while /slots moves, and is
    # a hang only after `stall_seconds` without progress.
    request_timeout: float = 180.0
    replay_floor: float = 30.0
    replay_cap: float = 1800.0
    stall_seconds: float = 120.0
    ready_timeout: float = 60.0
    divergence_seeds: int = 4
    log_dir: Path | None = None
    actor: str = ACTOR
    # Cumulative replays at which arms are examined; default: stats.look_schedule(cap).
    # A single look (e.g. [30]) is a fixed-sample design, for comparison benchmarks.
    looks: list[int] | None = None


class Diagnoser:
    """One diagnosis run of one failing exchange against one stack."""

    def __init__(
        self,
        store: Store,
        stack: Stack,
        request: dict[str, Any],
        *,
        exchange: dict[str, Any] | None = None,
        findings: list[dict[str, Any]] | None = None,
        incident: str | None = None,
        options: DiagnoseOptions | None = None,
        progress: ProgressFn | None = None,
        run_id: int | None = None,
    ) -> None:
        self.stack = stack
        self.request = copy.deepcopy(request)
        self.exchange = exchange or {}
        self.findings = findings or []
        self.incident_slug = incident
        self.options = options or DiagnoseOptions()
        if stack.max_requests and self.options.max_requests == DEFAULT_CAP:
            self.options.max_requests = stack.max_requests
        if stack.seed is not None and self.options.seed == 1000:
            self.options.seed = stack.seed
        self.progress = progress or (lambda event: None)
        self.recorder = runs_recorder(store, self.options.actor, run_id)
        self.schedule = self.options.looks or look_schedule(self.options.max_requests)
        self.arms: dict[str, ArmState] = {}
        self.planned: dict[str, probes.PlannedArm] = {}
        # Observation-only arms (`when = "observe"`): a hook, no replays.
        self.observe_only: list[probes.PlannedArm] = []
        # Arms run only when nothing else explains the failure (request-field ablation).
        self.held_back: list[probes.PlannedArm] = []
        # Arms that cannot matter for this stack and request: {"arm", "reason"} (issue 23).
        self.skipped: list[dict[str, str]] = []
        self.facts: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, Server] = {}
        self.signature = Signature.from_findings(self.findings, self.exchange)
        self.reproduction: dict[str, Any] | None = None
        self.crash: dict[str, Any] | None = None  # facts of a startup crash (crash mode)
        self.identity: ModelIdentity | None = None
        # Secret flag values of the stack (`--api-key KEY`, ...): scrubbed from every message,
        # log tail and fact before it is recorded or printed.
        self.secrets = secret_values(
            [*stack.server.args, *(stack.known_good.args if stack.known_good else [])]
        )
        self.started = time.monotonic()
        self.last_emit = self.started
        self.log_dir = self.options.log_dir or (data_dir() / "runs")
        self.replayer = LlamaReplayer(
            self.request,
            self.options.seed,
            self.options.request_timeout,
            self.options.concurrency,
            pace_options=PaceOptions(
                first=self.options.request_timeout,
                floor=min(self.options.replay_floor, self.options.replay_cap),
                cap=self.options.replay_cap,
                stall=self.options.stall_seconds,
            ),
        )

    # -- bookkeeping ---------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        self.recorder.heartbeat()  # a run that stops beating is taken as abandoned
        self.last_emit = time.monotonic()
        if isinstance(event, LookStarted | RepliesIn):
            event = dataclasses.replace(event, eta=self._eta())
        self.progress(event)

    def _eta(self) -> float | None:
        """The bound on the time left: replays still possible x measured time per replay /
        the replays each server runs at once."""
        slots = {
            key: self.options.concurrency or max(1, min(server.slots, 4))
            for key, server in self.servers.items()
        }
        bound = eta_bound(self.arms.values(), self.options.max_requests, slots)
        return None if bound is None else bound.seconds

    def _prepare(self) -> None:
        from triage.catalogue import catalogue

        server = self.stack.server
        identity = self._identity()
        new = runs.NewIncident(
            model=identity.name,
            kinds=[f["kind"] for f in self.findings if not f.get("passed", True)],
            weights=identity.weights,
            flags=safe_args(server.args),
            stack={
                "server": safe_describe(server),
                "speculative": self.stack.speculative,
                **({"model_path": identity.weights} if identity.weights else {}),
            },
        )
        causes = [runs.CauseSpec(c.id, c.title) for c in self._causes(catalogue().causes)]
        plan = {
            "request": self.request,
            "stack": safe_stack_raw(self.stack.raw),
            "stack_source": self.stack.source,
            resuming.STACK_LABEL: resuming.stack_label(self.stack),
            resuming.FINGERPRINTS: {
                "stack": resuming.stack_fingerprint(self.stack),
                "request": resuming.request_fingerprint(self.request),
            },
            "options": {"max_requests": self.options.max_requests, "seed": self.options.seed},
            "findings": self.findings,
        }
        self.recorder.prepare(
            self.incident_slug,
            new,
            causes,
            exchange=self.exchange,
            findings=self.findings,
            plan=plan,
        )
        self.incident_slug = self.recorder.incident_slug

    def _identity(self) -> ModelIdentity:
        """The model the incident is named after (triage.engine.naming): the GGUF file of
        a launched server, what a URL's server says it serves -- never the URL's host."""
        if self.identity is None:
            server = self.stack.server
            if server.model is not None:
                self.identity = identity_from_file(Path(server.model))
            elif server.url:
                self.identity = asyncio.run(
                    url_model_identity(server.url, api_key_from_args(server.args))
                )
            else:
                self.identity = ModelIdentity("server")
        return self.identity

    def _plan(self) -> None:
        incident_key = self.stack.server.key()
        crashed = self.crash is not None
        self.observe_only = []
        self.held_back = []
        self.skipped = [
            {"arm": arm, "reason": why}
            for arm, why in probes.skipped_arms(self.stack, self.request)
        ]
        for planned in probes.plan_arms(self.stack, self.request):
            if planned.when == "observe":
                if planned.observe is not None and not crashed:
                    self.observe_only.append(planned)
                continue
            if is_held_back(planned):
                if not crashed:
                    self.held_back.append(planned)
                continue
            if planned.name != cause_rules.BASELINE and (
                (planned.when == "crash" and not crashed)
                or (crashed and planned.level == "request")
            ):
                # crash-only arms need a crash; a crashed server serves no request
                why = (
                    "runs only when the incident's server crashes"
                    if planned.when == "crash"
                    else "the incident's server crashed: it serves no request"
                )
                self.skipped.append({"arm": planned.name, "reason": why})
                continue
            key = incident_key if planned.level == "request" else planned.config.key()  # type: ignore[union-attr]
            self.planned[planned.name] = planned
            self.arms[planned.name] = ArmState(
                planned.name, planned.variant, planned.level, key, planned.decides
            )
        for reply in self.recorder.previous_replies():
            arm = self.arms.get(reply.arm)
            # A replay that ended without an answer (timeout, HTTP failure) is replayed
            # again on resume; its errored reply stays in the evidence.
            if arm is not None and not reply.error and not arm.has(reply.index):
                arm.replies.append(reply)

    def _scheduler(self) -> Scheduler:
        def on_look(look: int, target: int, active: list[str]) -> None:
            self._emit(LookStarted(look + 1, len(self.schedule), target, tuple(active)))

        return Scheduler(
            self.schedule,
            self.options.max_requests,
            judge=self._judge,
            on_replies=self._record_replies,
            on_look=on_look,
        )

    def _causes(self, causes: Any) -> list[Any]:
        """The causes this run decides: crash-only causes (`when = "crash"`) only when the
        incident's server crashed at startup."""
        crashed = self.crash is not None
        return [c for c in causes if getattr(c, "when", "always") != "crash" or crashed]

    def _decide(self, outcomes: Any) -> list[cause_rules.Verdict]:
        from triage.catalogue import catalogue

        return cause_rules.decide(outcomes, self._observations(), self._causes(catalogue().causes))

    def _judge(self, outcomes: Any) -> dict[str, str]:
        return {v.cause: v.status for v in self._decide(outcomes)}

    def _observations(self) -> cause_rules.Observations:
        return cause_rules.observations_from(
            self.facts,
            self.stack,
            speculative=self._speculative(),
            planned=tuple(self.planned),
            request=self.request,
        )

    def _speculative(self) -> bool:
        """Speculative decoding is on: flags in the stack, the server's /props, or draft
        tokens in the baseline's timings (a URL stack shows it only there)."""
        if self.stack.speculative or self.facts.get("server-props", {}).get("speculative"):
            return True
        baseline = self.arms.get(cause_rules.BASELINE)
        return baseline is not None and any(
            int(r.timings.get("draft_n", 0) or 0) > 0 for r in baseline.replies
        )

    # -- main ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._preflight()
        with ExitStack() as servers:
            # The incident's server starts before anything is recorded: a launch that fails
            # leaves no incident and no run behind.
            base = self._launch_base(servers)
            self._lint_model(base)  # model-file lint, before any replay (issue 23)
            # From here on the run row exists: whatever stops the run -- Ctrl-C in any
            # phase (plan, observation, reproduction gate, arms, recording the result) or
            # an unexpected error -- leaves it interrupted, hence resumable.
            self._prepare()
            try:
                self._plan()
                kg_dims = probes.known_good_dimensions(self.stack) if base is not None else {}
                server_arms = [p for p in self.planned.values() if p.level == "server"]
                self._emit(
                    ArmsPlanned(
                        len(self.planned) - len(server_arms),
                        len(server_arms),
                        tuple(sorted(kg_dims)),
                    )
                )
                assert self.recorder.run_id is not None
                log_dir = self.log_dir / f"run-{self.recorder.run_id}"
                log_dir.mkdir(parents=True, exist_ok=True)
                if base is None:
                    self._run_crash_mode(log_dir)
                else:
                    self._run_arms(base, kg_dims, log_dir)
            except EngineError:
                self.recorder.set_state("failed", finished=True)
                raise
            except BaseException:
                self.recorder.set_state("interrupted")
                raise
        try:
            self._note_failures()
            return self._finish()
        except BaseException:
            self.recorder.set_state("interrupted")  # the result was not recorded
            raise

    def _lint_model(self, base: Server | None) -> None:
        """The model-file lint findings (GGUF metadata and the server's own log) join the
        diagnosis's findings; the reproduction signature stays the captured exchange's."""
        log = getattr(getattr(base, "handle", None), "log_path", None) if base else None
        extra = lint_findings(self.stack.server, self.request, log)
        known = {f.get("kind") for f in self.findings}
        self.findings = [*self.findings, *(f for f in extra if f["kind"] not in known)]

    def _note_failures(self) -> None:
        """Each server that crashed mid-request or hung: its CrashReport as an observation
        (signal, backtrace symbol, CPU flags, log tail, the report's sentence)."""
        for server in self.servers.values():
            if server.failure is None:
                continue
            facts = crash_facts(server.failure)
            arms = sorted(a.name for a in self.arms.values() if a.group == server.key)
            name = (
                facts["name"]
                if server.config is self.stack.server
                else f"{'+'.join(arms) or server.key}-{facts['name']}"
            )
            self.facts[name] = {**facts, "name": name, "arms": arms}

    def _preflight(self) -> None:
        """Refuse what cannot work before launching or recording anything."""
        problem = body_problem(self.request)
        if problem is not None:
            raise EngineError(f"request: {problem}")
        if self.incident_slug and not self.recorder.incident_exists(self.incident_slug):
            raise EngineError(
                f"--incident {self.incident_slug!r}: no such incident (omit "
                "--incident to open a new one)"
            )
        server = self.stack.server
        if server.model is None and server.url:
            check_url(server.url)
        else:
            check_config(server, "$.server")
        if self.stack.gateway is not None:
            check_gateway(self.stack.gateway)
        for planned in probes.plan_arms(self.stack, self.request):
            if planned.config is not None:
                check_config(planned.config, f"arm {planned.name}")

    def _launch_base(self, servers: ExitStack) -> Server | None:
        server = self.stack.server
        if server.model is None and server.url:
            from triage.capture.redact import redact_url

            self._emit(
                ProgressEvent(
                    "launch",
                    f"using the running server at {redact_url(server.url)} (a URL stack: "
                    "triage neither starts nor stops it)",
                )
            )
        else:
            self._emit(ProgressEvent("launch", "starting the incident's server"))
        stamp = (
            f"run-{self.recorder.run_id}"
            if self.recorder.run_id
            else f"launch-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        )
        try:
            base = servers.enter_context(
                open_server(
                    self.stack.server, self.log_dir / stamp / "incident", self.options.ready_timeout
                )
            )
        except EngineError:
            raise
        except Exception as exc:
            crash = startup_crash(exc)
            if crash is None:
                report = report_of(exc)
                why = report.sentence() if report is not None else str(exc)
                why += startup_refusal(exc, report)
                why = scrub_secrets(why, self.secrets)  # the launcher may quote its argv
                raise EngineError(f"the incident's server did not start: {why}") from None
            crash = scrub_secrets(crash, self.secrets)
            # A crash at startup is the failure to diagnose, not an error (issue 12).
            self.crash = crash
            self._emit(ProgressEvent("crash", crash["summary"] + "; diagnosing the crash"))
            return None
        self.servers[base.key] = base
        return base

    def _run_arms(self, base: Server, kg_dims: dict[str, tuple[Any, Any]], log_dir: Path) -> None:
        if base.pace is None and self.replayer.pace_options is not None:
            # The observation requests measure the server's speed first (pacing).
            base.pace = ServerPace(self.replayer.pace_options)
        asyncio.run(
            observe.observe_server(
                base,
                self.request,
                self.facts,
                seed=self.options.seed,
                timeout=self.options.request_timeout,
            )
        )
        for planned in self.observe_only:
            self._observe(planned, base, base)
        if self._base_failed(base):  # it crashed (or hung) on the observation requests
            self._crash_mode_after(base, log_dir)
            return
        self._skip_unmet()
        self._configure()
        request_arms = [p for p in self.planned.values() if p.level == "request"]
        client_side = gateway_server(self.stack, base)  # what the client used
        for planned in request_arms:
            self.arms[planned.name].launch_seconds = base.launch_seconds
            target = base if planned.endpoint == "server" else client_side
            self.replayer.routes[planned.name] = ArmRoute(
                target, planned.transform, stream=planned.stream
            )
        scheduler = self._scheduler()
        rounds = self._server_rounds()
        with LaunchPool(log_dir, self.options.ready_timeout) as pool:
            # The first round's servers start now, while the baseline and the request-level
            # arms replay on the incident's server; none replays before the gate passed.
            self._start_round(pool, rounds[0] if rounds else [])
            if not self._reproduce(scheduler):
                return
            crashed = self._base_failed(base)  # the baseline's replays crashed or hung it
            if not crashed:
                # One run: the request-level arms and the first round's server-level arms,
                # each joining as soon as its server is up, all busy at the same time.
                first = rounds[0] if rounds else []
                self._run_round(pool, first, base, [p.name for p in request_arms])
                for names in rounds[1:]:
                    self._start_round(pool, names)
                    self._run_round(pool, names, base)
                self._run_held_back(pool, base)
        if crashed:
            self._crash_mode_after(base, log_dir)
            return
        if kg_dims:
            self.facts["known-good-search"] = known_good.search(
                self.stack,
                kg_dims,
                lambda name, variant, config: self._kg_arm(name, variant, config, base, log_dir),
            )

    def _run_held_back(self, pool: LaunchPool, base: Server) -> None:
        """The held-back arms (request-field ablation), only when the baseline reproduced
        and no cause is confirmed after every other arm; else each is listed as skipped."""
        if not self.held_back:
            return
        outcomes = {n: a.outcome() for n, a in self.arms.items()}
        why = not_needed(self._decide(outcomes), cause_rules.reproduces(outcomes))
        if why is not None or self._base_failed(base):
            why = why or "the incident's server crashed or hung"
            self.skipped += [{"arm": p.name, "reason": why} for p in self.held_back]
            return
        previous = self.recorder.previous_replies()
        for planned in self.held_back:
            self.planned[planned.name] = planned
            arm = ArmState(planned.name, planned.variant, "request", base.key, planned.decides)
            arm.replies = [r for r in previous if r.arm == planned.name and not r.error]
            arm.launch_seconds = base.launch_seconds
            self.arms[planned.name] = arm
            self.replayer.routes[planned.name] = ArmRoute(base, planned.transform)
        names = [p.name for p in self.held_back]
        self._emit(
            ProgressEvent("plan", "no cause confirmed: request-field ablation: " + ", ".join(names))
        )
        self._run_round(pool, [], base, names)

    def _skip_unmet(self) -> None:
        """Drop the arms whose precondition the observations refute (e.g. thinking-off when
        the template render shows no thinking for the request): they cannot matter. An arm
        with replies already recorded (a resumed run) keeps them and stays."""
        for name, planned in list(self.planned.items()):
            arm = self.arms[name]
            if name == cause_rules.BASELINE or planned.requires is None or arm.replies:
                continue
            why = planned.requires(self.facts, self.exchange or None)
            if why is None:
                continue
            del self.planned[name], self.arms[name]
            self.skipped.append({"arm": name, "reason": why})
            self._emit(ArmSkipped(name, why))

    def _configure(self) -> None:
        """Server-level arms whose launch depends on the observations (PlannedArm.configure,
        e.g. -ub from the measured input tokens): launched as configured, or skipped."""
        for name, planned in list(self.planned.items()):
            if planned.configure is None:
                continue
            outcome = planned.configure(self.facts)
            if isinstance(outcome, str):
                if self.arms[name].replies:  # a resumed run keeps what it recorded
                    continue
                del self.planned[name], self.arms[name]
                self.skipped.append({"arm": name, "reason": outcome})
                self._emit(ArmSkipped(name, outcome))
                continue
            if outcome.config is None:
                raise EngineError(f"arm {name}: configured without a server configuration")
            check_config(outcome.config, f"arm {name}")
            self.planned[name] = outcome
            self.arms[name].group = outcome.config.key()
            self.arms[name].variant = outcome.variant

    def _server_rounds(self) -> list[list[str]]:
        """The server-level arms still to run, in rounds whose servers fit in memory together
        (launches.launch_rounds)."""
        todo = [
            (name, planned.config)
            for name, planned in self.planned.items()
            if planned.level == "server"
            and planned.config is not None
            and self.arms[name].decision in ("not-run", "undecided")
            and not self.arms[name].error
        ]
        return launch_rounds(todo, memory_available())

    def _start_round(self, pool: LaunchPool, names: Sequence[str]) -> None:
        for name in names:
            config = self.planned[name].config
            assert config is not None
            self._emit(ProgressEvent("launch", f"starting server for {name}"))
            pool.start(name, config, _safe(name))

    def _run_round(
        self, pool: LaunchPool, names: Sequence[str], base: Server, request: Sequence[str] = ()
    ) -> None:
        """One scheduler run of the `request` arms and of the server-level arms `names`
        (started in `pool`), each joining when its server is up; an arm whose server failed
        to start is errored. Their servers are stopped when the run ends."""
        joining = {name: self._join(pool, name, base) for name in names}
        try:
            if request or names:
                run = self._scheduler().run(self.arms, [*request, *names], self.replayer, joining)
                asyncio.run(run)
        finally:
            for name in names:
                pool.launches[name].stop()

    async def _join(self, pool: LaunchPool, name: str, base: Server) -> bool:
        """Wait for the arm's server, observe it (the arm's hook), route the arm to it."""
        planned, arm = self.planned[name], self.arms[name]
        try:
            server = await asyncio.wrap_future(pool.launches[name].future)
            arm.launch_seconds = server.launch_seconds
            self.servers[server.key] = server
            if planned.observe is not None:
                await self._observe_async(planned, base, server)
            self.replayer.routes[name] = ArmRoute(server, planned.transform)
        except Exception as exc:  # noqa: BLE001 - a failed launch is an errored arm
            self._mark_died(arm, exc)
            return False
        return True

    @staticmethod
    def _base_failed(base: Server) -> bool:
        """The incident's own server crashed mid-request or hung (its CrashReport kept)."""
        if base.failure is None and base.handle is not None and not base.alive():
            base.failure = base.crash_report()
        return base.failure is not None

    def _crash_mode_after(self, base: Server, log_dir: Path) -> None:
        """The incident's server started but crashed mid-request or hung: the crash is the
        failure to diagnose (issue 12), probed like a startup crash -- every replay is a
        launch plus one request -- by the crash-only arms (no-repack, ...)."""
        self.crash = crash_facts(base.failure)
        self._emit(
            ProgressEvent(
                "crash", self.crash["summary"] + "; diagnosing the crash, one launch per replay"
            )
        )
        self._prepare()  # the crash-only causes (cpu-backend) join the incident's causes
        self.arms.clear()
        self.planned.clear()
        self._plan()  # crash-only server arms; the baseline keeps its recorded replies
        self._run_crash_mode(log_dir)

    def _run_crash_mode(self, log_dir: Path) -> None:
        """The incident's server crashes (at startup, mid-request) or hangs: every replay of
        the baseline and of each server-level arm is a launch (plus one request when it
        starts), and the failure compared across arms is the crash."""
        assert self.crash is not None
        self.facts[str(self.crash["name"])] = self.crash
        startup = self.crash.get("phase", "startup") == "startup"
        if startup:
            self.reproduction = {
                "reproduced": True,
                "message": self.crash["summary"],
                "signature": {"kinds": [CRASH_KIND], "finish_reason": None, "status_class": None},
            }
        router = _Router()
        for name, planned in self.planned.items():
            config = self.stack.server if name == cause_rules.BASELINE else planned.config
            router.routes[name] = LaunchEachTime(
                config,
                log_dir / _safe(name),
                self.options.ready_timeout,
                self.request,
                self.options.seed,
                self.options.request_timeout,
                planned.transform,
            )
        scheduler = self._scheduler()
        asyncio.run(scheduler.baseline_look(self.arms, self.schedule[0], router))
        if not startup and not self._gate():
            return
        for name, planned in self.planned.items():
            if planned.level == "server":
                self._emit(ProgressEvent("launch", f"launching {name} once per replay"))
                asyncio.run(scheduler.run(self.arms, [name], router))

    def _reproduce(self, scheduler: Scheduler) -> bool:
        """The reproduction gate: the baseline's first look must show the captured failure
        signature; otherwise no arm runs and no cause moves."""
        asyncio.run(scheduler.baseline_look(self.arms, self.schedule[0], self.replayer))
        return self._gate()

    def _gate(self) -> bool:
        """Apply the reproduction gate to the baseline's replies so far."""
        baseline = self.arms[cause_rules.BASELINE]
        message = gate_message(self.signature, baseline)
        self.reproduction = {
            "reproduced": message is None,
            "message": message or "the baseline reproduces the captured failure",
            "signature": self.signature.to_dict(),
        }
        if message is not None:
            self._emit(ProgressEvent("gate", message))
            for arm in self.arms.values():
                if arm.name != cause_rules.BASELINE:
                    arm.stopped = "not run: the failure did not reproduce"
        return message is None

    def _mark_died(self, arm: ArmState, exc: BaseException) -> None:
        """An arm whose server failed to start (or died) is errored; its CrashReport, when
        the launcher has one, is the error's text and an observation of its own."""
        report = report_of(exc)
        if report is not None:
            facts = crash_facts(report)
            self.facts[f"{arm.name}-{facts['name']}"] = {
                **facts,
                "name": f"{arm.name}-{facts['name']}",
                "arm": arm.name,
            }
        if not arm.error:
            arm.error = report.sentence() if report is not None else f"{type(exc).__name__}: {exc}"
            arm.log_tail = str(getattr(exc, "log_tail", ""))
            arm.decision = "errored"
            arm.stopped = "server failed"

    def _observe(self, planned: probes.PlannedArm, base: Server, server: Server) -> None:
        asyncio.run(self._observe_async(planned, base, server))

    async def _observe_async(
        self, planned: probes.PlannedArm, base: Server, server: Server
    ) -> None:
        assert planned.observe is not None
        context = probes.ObserveContext(
            base,
            server,
            self.request,
            self.options.seed,
            self.options.request_timeout,
            self.options.divergence_seeds,
            exchange=self.exchange or None,
            client_side=gateway_server(self.stack, base),
        )
        facts: dict[str, Any] | None
        try:
            facts = await planned.observe(context)
        except Exception as exc:  # noqa: BLE001 - an observation is recorded, not fatal
            facts = {"name": f"{planned.name}-observation", "error": f"{type(exc).__name__}: {exc}"}
        if facts:
            facts = {"name": planned.name, **facts}
            self.facts[str(facts["name"])] = facts

    def _kg_arm(
        self, name: str, variant: str, config: ServerConfig, base: Server, log_dir: Path
    ) -> str:
        self.arms[name] = ArmState(name, variant, "server", config.key())
        planned = probes.PlannedArm(name, variant, "server", config=config)
        self.planned[name] = planned
        with LaunchPool(log_dir, self.options.ready_timeout) as pool:
            self._start_round(pool, [name])
            self._run_round(pool, [name], base)
        return self.arms[name].decision

    def _record_replies(self, replies: Sequence[Reply]) -> None:
        """Store replies, their error text scrubbed of secret flag values (a failed launch
        quotes its argv)."""
        if self.secrets:
            replies = [
                dataclasses.replace(r, error=scrub_secrets(r.error, self.secrets)) if r.error else r
                for r in replies
            ]
        self.recorder.record_replies(replies)
        if replies and time.monotonic() - self.last_emit >= QUIET_SECONDS:
            # A slow server: say what came in (and the updated bound) between looks.
            arm = self.arms.get(replies[0].arm)
            if arm is not None:
                self._emit(
                    RepliesIn(arm.name, len(arm.replies), arm.failures, len(arm.replies) - arm.n)
                )

    # -- results -----------------------------------------------------------------------------
    def _finish(self) -> dict[str, Any]:
        gate_failed = self.reproduction is not None and not self.reproduction["reproduced"]
        for arm in self.arms.values():
            no_replies(arm)  # replays that all ended without an answer: errored, with why
        obs = self._observations()
        verdicts = self._decide({n: a.outcome() for n, a in self.arms.items()})
        for arm in self.arms.values():  # an error or log tail may quote a launch argv
            arm.error = scrub_secrets(arm.error, self.secrets)
            arm.log_tail = scrub_secrets(arm.log_tail, self.secrets)
        self.facts = scrub_secrets(self.facts, self.secrets)
        for arm in self.arms.values():
            if not arm.n and not arm.error:  # never silently 0/0 (issue 28)
                arm.decision = "not-run"
                arm.stopped = arm.stopped or "the run ended before this arm replayed"
        summaries = [arm_summary(a) for a in self.arms.values()]
        if gate_failed:
            # A baseline that failed differently is not the incident's baseline: keep its
            # replies as a reproduction measurement, never as a `baseline` arm.
            summaries = []
            self.facts["reproduction"] = {
                "name": "reproduction",
                **(self.reproduction or {}),
                "summary": (self.reproduction or {}).get("message"),
                "baseline": arm_summary(self.arms[cause_rules.BASELINE]).to_dict(),
            }
        rows = (
            None
            if gate_failed
            else [
                runs.VerdictRow(
                    v.cause,
                    v.status,
                    v.rationale,
                    list(v.supports),
                    list(v.refutes),
                    v.deciding_probe,
                    v.basis,
                )
                for v in verdicts
            ]
        )
        errored = [a for a in self.arms.values() if a.error]
        unrun = [] if gate_failed else [a for a in self.arms.values() if not a.n and not a.error]
        # A run with an arm that got no reply did not finish its job: not "done".
        state = "not-reproduced" if gate_failed else ("partial" if errored or unrun else "done")

        def build(changes: dict[str, Any], record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            keys = self.recorder.keys
            shown = verdicts if not gate_failed else []
            diagnosis = build_diagnosis(
                slug=self.recorder.incident_slug,
                run_id=self.recorder.run_id,
                findings=self.findings,
                stack={
                    **stack_summary(self.stack, obs.speculative_enabled),
                    "host_workaround": _host_workaround(self.stack),
                },
                arms=[(s, self.recorder.evidence_keys.get(s.arm)) for s in summaries],
                observations=[
                    {**facts, "evidence": self.recorder.evidence_keys.get(name)}
                    for name, facts in self.facts.items()
                ],
                verdicts=shown,
                changes=changes,
                keys=keys,
                errors=[f"arm {a.name} errored: {a.error}" for a in errored]
                + [f"arm {a.name} not run: {a.stopped}" for a in unrun],
                graph=graph_mod.summary(graph_mod.build_graph(record)),
                cost=self._cost(),
                skipped=self.skipped,
                exchange_evidence=self.recorder.evidence_keys.get("exchange"),
                state=state,
                reproduction=self.reproduction,
            )
            if gate_failed:
                diagnosis["causes"] = _standing_causes(record)
            return state, diagnosis

        result: dict[str, Any] = self.recorder.record_results(
            summaries, self.facts, observe.observation_summary, rows, build
        )
        self._emit(ProgressEvent("done", f"diagnosis of {self.recorder.incident_slug} recorded"))
        return result

    def _cost(self) -> dict[str, Any]:
        requests = sum(len(a.replies) for a in self.arms.values())
        return {
            "requests": requests,
            "wall_seconds": round(time.monotonic() - self.started, 3),
            "server_seconds": round(sum(server_seconds(a) for a in self.arms.values()), 3),
            "launch_seconds": round(sum(s.launch_seconds for s in self.servers.values()), 3),
        }


def _standing_causes(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The causes as they stand (this run moved none)."""
    out: list[dict[str, Any]] = []
    for cause in record.get("causes") or []:
        status = str(cause.get("status", "suspected"))
        out.append(
            {
                "id": str(cause.get("id")),
                "status": status,
                "rationale": str(cause.get("rationale") or "not moved by this run"),
                "evidence": [],
                "deciding_probe": str(cause.get("deciding_probe") or ""),
                "previous_status": status,
                "undecided": "the failure did not reproduce in this run"
                if status == "suspected"
                else None,
            }
        )
    return out


@dataclass
class _Router:
    """A Replayer that sends each arm to its own replayer."""

    routes: dict[str, Any] = field(default_factory=dict)

    async def replay(self, arm: str, indices: Any) -> list[Any]:
        return list(await self.routes[arm].replay(arm, indices))


def startup_refusal(exc: BaseException, report: Any) -> str:
    """For a server that exited with an error code at startup (not a signal): the log line
    where it refused its launch configuration, as a finding of the server-flags cause."""
    from triage.llama.flags import flag_error_line

    texts = [str(getattr(exc, "log_tail", "") or ""), str(exc)]
    if report is not None:
        texts += [str(line) for line in getattr(report, "log_tail", ()) or ()]
        texts += [str(line) for line in getattr(report, "errors", ()) or ()]
    line = flag_error_line("\n".join(texts))
    if line is None:
        return ""
    return (
        f"; server-flags: it refused its launch configuration ({line!r}): fix or remove that "
        "flag (its --help lists what this build accepts)"
    )


def _host_workaround(stack: Stack) -> str | None:
    """The host workaround a drill's stack carries (e.g. --no-repack on an AMX host), else
    None: a user's own stack has none, so nothing hides a crash of the user's server."""
    from triage.drills.host import stack_host_note

    return stack_host_note(stack.source) if stack.source else None


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def runs_recorder(store: Store, actor: str, run_id: int | None) -> Any:
    from triage.engine.recorder import Recorder

    return Recorder(store, actor, run_id=run_id)
