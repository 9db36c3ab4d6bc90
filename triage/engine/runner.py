"""One diagnosis run, top to bottom: plan -> execute -> decide -> record -> Diagnosis.

`Diagnoser.run` checks what cannot work, plans the arms once (triage.engine.plan), starts
the incident's server (a launch that fails records nothing; one that crashes turns the plan
into crash mode), opens the incident and the run row (triage.engine.recorder), runs the
plan in one event loop (triage.engine.execute), decides the verdicts
(triage.engine.decide) and writes them in one transaction (triage.engine.record). Each
step hands a typed record to the next; none calls back into this module.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb.domain.diagnosis import Diagnosis, Finding, failed_kinds
from kb.jsontypes import JsonObject
from kb.repo import runs
from kb.repo.engine import data_dir
from kb.repo.store import Store
from triage.capture.redact import redact_url
from triage.catalogue import catalogue
from triage.engine import resuming
from triage.engine.backend import Backend, LlamaBackend
from triage.engine.crashes import report_of, startup_crash
from triage.engine.decide import decide
from triage.engine.events import ArmsPlanned, Event, ProgressEvent, ProgressFn
from triage.engine.execute import Executor, note_failures
from triage.engine.naming import ModelIdentity, identity_from_file, url_model_identity
from triage.engine.pacing import PaceOptions
from triage.engine.plan import Plan, plan
from triage.engine.progress import ExecuteOptions, Progress
from triage.engine.record import record
from triage.engine.recorder import Recorder
from triage.engine.reproduction import Signature
from triage.engine.server_log import note_server_logs
from triage.engine.servers import (
    EngineError,
    Server,
    api_key_from_args,
    check_gateway,
    safe_args,
    safe_describe,
    safe_stack_raw,
    scrub_secrets,
    secret_values,
)
from triage.llama.endpoints import body_problem
from triage.llama.flags import flag_error_line
from triage.llama.model_lint import lint_findings
from triage.stackfile import Stack
from triage.stats import DEFAULT_CAP, look_schedule

__all__ = ["ACTOR", "DiagnoseOptions", "Diagnoser", "startup_refusal"]

ACTOR = "engine"


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
    # False runs every planned arm even when the observations show it cannot matter (the
    # runtime `requires` preconditions, issue 23): only to measure what they save.
    check_preconditions: bool = True


class Diagnoser:
    """One diagnosis run of one failing exchange against one stack."""

    def __init__(
        self,
        store: Store,
        stack: Stack,
        request: JsonObject,
        *,
        exchange: JsonObject | None = None,
        findings: Sequence[Finding] = (),
        incident: str | None = None,
        options: DiagnoseOptions | None = None,
        progress: ProgressFn | None = None,
        run_id: int | None = None,
        exchange_evidence: str | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.backend: Backend = backend or LlamaBackend()
        self.stack = stack
        self.request = copy.deepcopy(request)
        self.exchange = exchange or {}
        self.findings = list(findings)
        # The captured failure the baseline must reproduce (the model-file lint's findings,
        # added once the server started, do not change it).
        self.signature = Signature.from_findings(self.findings, self.exchange)
        self.incident_slug = incident
        self.options = options or DiagnoseOptions()
        if stack.max_requests and self.options.max_requests == DEFAULT_CAP:
            self.options.max_requests = stack.max_requests
        if stack.seed is not None and self.options.seed == 1000:
            self.options.seed = stack.seed
        self.recorder = Recorder(store, self.options.actor, run_id=run_id)
        if exchange_evidence:  # a resumed run: the exchange it stored
            self.recorder.evidence_keys["exchange"] = exchange_evidence
        self.progress = Progress(progress or _quiet, self.recorder, self._execute_options())
        self.crash: dict[str, Any] | None = None  # facts of a startup crash (crash mode)
        self.identity: ModelIdentity | None = None
        # Secret flag values of the stack (`--api-key KEY`, ...): scrubbed from every message,
        # log tail and fact before it is recorded or printed.
        self.secrets = secret_values(
            [*stack.server.args, *(stack.known_good.args if stack.known_good else [])]
        )
        self.log_dir = self.options.log_dir or (data_dir() / "runs")
        # The arms, planned once from the catalogue (crash mode is this plan rearranged).
        found = catalogue()
        self.plan = plan(stack, self.request, list(found.arms), list(found.causes))

    def _execute_options(self) -> ExecuteOptions:
        options = self.options
        return ExecuteOptions(
            max_requests=options.max_requests,
            seed=options.seed,
            concurrency=options.concurrency,
            request_timeout=options.request_timeout,
            ready_timeout=options.ready_timeout,
            divergence_seeds=options.divergence_seeds,
            schedule=tuple(options.looks or look_schedule(options.max_requests)),
            pace=PaceOptions(
                first=options.request_timeout,
                floor=min(options.replay_floor, options.replay_cap),
                cap=options.replay_cap,
                stall=options.stall_seconds,
            ),
            check_preconditions=options.check_preconditions,
        )

    def _emit(self, event: Event) -> None:
        self.progress.emit(event)

    def run(self) -> Diagnosis:
        self._preflight()
        started = time.monotonic()
        with ExitStack() as servers:
            # The incident's server starts before anything is recorded: a launch that fails
            # leaves no incident and no run behind.
            base = self._launch_base(servers)
            self._lint_model(base)  # model-file lint, before any replay (issue 23)
            chosen = self.plan if base is not None else self.plan.for_crash()
            # From here on the run row exists: whatever stops the run -- Ctrl-C in any
            # phase (plan, observation, reproduction gate, arms, recording the result) or
            # an unexpected error -- leaves it interrupted, hence resumable.
            self._prepare(chosen)
            try:
                executor = self._executor(chosen, base)
                self._emit(
                    ArmsPlanned(
                        len(chosen.request_arms),
                        len(chosen.server_arms),
                        tuple(sorted(chosen.known_good)) if base is not None else (),
                    )
                )
                assert self.recorder.run_id is not None
                log_dir = self.log_dir / f"run-{self.recorder.run_id}"
                log_dir.mkdir(parents=True, exist_ok=True)
                execution = asyncio.run(executor.run(base, log_dir))
            except EngineError:
                self.recorder.set_state("failed", finished=True)
                raise
            except BaseException:
                self.recorder.set_state("interrupted")
                raise
        try:
            note_failures(execution)
            note_server_logs(execution)  # the grammar lines of each server's log (issue 24)
            decision = decide(execution, self.secrets, time.monotonic() - started)
            result = record(self.recorder, decision, self.findings, execution.plan.skipped)
            self._emit(
                ProgressEvent("done", f"diagnosis of {self.recorder.incident_slug} recorded")
            )
            return result
        except BaseException:
            self.recorder.set_state("interrupted")  # the result was not recorded
            raise

    def _executor(self, chosen: Plan, base: Server | None) -> Executor:
        executor = Executor(
            chosen,
            exchange=self.exchange,
            signature=self.signature,
            options=self.progress.options,
            backend=self.backend,
            recorder=self.recorder,
            progress=self.progress,
            secrets=self.secrets,
            crash=self.crash,
        )
        if base is not None:
            executor.execution.servers[base.key] = base
        return executor

    def _lint_model(self, base: Server | None) -> None:
        """The model-file lint findings (GGUF metadata and the server's own log) join the
        diagnosis's findings; the reproduction signature stays the captured exchange's."""
        log = getattr(getattr(base, "handle", None), "log_path", None) if base else None
        extra = lint_findings(self.stack.server, self.request, log)
        known = {f.kind for f in self.findings}
        self.findings += [f.record(with_offset=True) for f in extra if f.kind not in known]

    def _prepare(self, plan: Plan) -> None:
        server = self.stack.server
        identity = self._identity()
        new = runs.NewIncident(
            model=identity.name,
            kinds=failed_kinds(self.findings),
            weights=identity.weights,
            flags=safe_args(server.args),
            stack={
                "server": safe_describe(server),
                "speculative": self.stack.speculative,
                **({"model_path": identity.weights} if identity.weights else {}),
            },
        )
        causes = [runs.CauseSpec(c.id, c.title) for c in plan.causes]
        row = {
            "request": self.request,
            "stack": safe_stack_raw(self.stack.raw),
            "stack_source": self.stack.source,
            resuming.STACK_LABEL: resuming.stack_label(self.stack),
            resuming.FINGERPRINTS: {
                "stack": resuming.stack_fingerprint(self.stack),
                "request": resuming.request_fingerprint(self.request),
            },
            "options": {"max_requests": self.options.max_requests, "seed": self.options.seed},
            "findings": [f.to_json() for f in self.findings],
        }
        self.recorder.prepare(
            self.incident_slug,
            new,
            causes,
            exchange=self.exchange,
            findings=self.findings,
            plan=row,
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
            self.backend.check_url(server.url)
        else:
            self.backend.check_config(server, "$.server")
        if self.stack.gateway is not None:
            check_gateway(self.stack.gateway)
        for planned in self.plan.every:  # the plan, computed once
            if planned.config is not None:
                self.backend.check_config(planned.config, f"arm {planned.name}")

    def _launch_base(self, servers: ExitStack) -> Server | None:
        server = self.stack.server
        if server.model is None and server.url:
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
                self.backend.launch(
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
        return base


def startup_refusal(exc: BaseException, report: Any) -> str:
    """For a server that exited with an error code at startup (not a signal): the log line
    where it refused its launch configuration, as a finding of the server-flags cause."""
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


def _quiet(event: Event) -> None:
    """No progress wanted."""
