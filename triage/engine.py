"""The triage engine: plan -> run -> record -> update -> Diagnosis.

One launch per distinct server configuration; request-level arms share the incident's
server and run concurrently up to its slots. Every reply is stored as evidence as soon as
its look completes (one transaction per look), so an interrupted run leaves the KB
consistent and `--resume` continues from the replies already recorded.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from kb.models import CAUSE_CATALOGUE_IDS, Cause, EvidenceLink, Incident, Symptom, TriageRun, utcnow
from kb.store import (
    Store,
    add_evidence,
    add_evidence_many,
    data_dir,
    get_incident,
    record_status_change,
)
from triage import causes as cause_rules
from triage import observe, probes
from triage.observe import committed_text, finish_reason_of, message_of, raw_misplaced
from triage.stackfile import ServerConfig, Stack
from triage.stats import DEFAULT_CAP, compare, look_schedule, wilson

ACTOR = "engine"
RAW_TEXT_LIMIT = 4000  # characters of each reply's text fields kept in evidence


class EngineError(Exception):
    """The engine cannot start (bad stack, no binary, no failing exchange)."""


@dataclass
class DiagnoseOptions:
    max_requests: int = DEFAULT_CAP  # per arm
    seed: int = 1000
    concurrency: int | None = None  # default: the server's slots, at most 4
    request_timeout: float = 180.0
    ready_timeout: float = 60.0
    divergence_seeds: int = 4
    log_dir: Path | None = None
    actor: str = ACTOR
    # Cumulative replays at which arms are examined; default: stats.look_schedule(cap).
    # A single look (e.g. [30]) is a fixed-sample design, for comparison benchmarks.
    looks: list[int] | None = None


@dataclass
class ProgressEvent:
    stage: str
    message: str
    done: int = 0
    total: int = 0


ProgressFn = Callable[[ProgressEvent], None]


@dataclass
class Reply:
    arm: str
    index: int
    seed: int
    failed: bool
    kinds: list[str]
    finish_reason: str | None
    content_chars: int
    reasoning_chars: int
    status: int | None
    elapsed_s: float
    timings: dict[str, Any]
    raw_misplaced: bool = False
    error: str = ""
    text: str = ""  # committed text (reasoning + content + tool calls), for divergence

    def payload(self) -> dict[str, Any]:
        return {
            "type": "reply",
            "arm": self.arm,
            "index": self.index,
            "seed": self.seed,
            "failed": self.failed,
            "kinds": self.kinds,
            "finish_reason": self.finish_reason,
            "content_chars": self.content_chars,
            "reasoning_chars": self.reasoning_chars,
            "status": self.status,
            "elapsed_s": round(self.elapsed_s, 4),
            "timings": self.timings,
            "raw_misplaced": self.raw_misplaced,
            "error": self.error,
            "text": self.text[:RAW_TEXT_LIMIT],
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Reply:
        return cls(
            arm=payload["arm"],
            index=int(payload["index"]),
            seed=int(payload["seed"]),
            failed=bool(payload["failed"]),
            kinds=list(payload.get("kinds", [])),
            finish_reason=payload.get("finish_reason"),
            content_chars=int(payload.get("content_chars", 0)),
            reasoning_chars=int(payload.get("reasoning_chars", 0)),
            status=payload.get("status"),
            elapsed_s=float(payload.get("elapsed_s", 0.0)),
            timings=dict(payload.get("timings") or {}),
            raw_misplaced=bool(payload.get("raw_misplaced", False)),
            error=str(payload.get("error", "")),
            text=str(payload.get("text", "")),
        )


@dataclass
class ArmState:
    name: str
    variant: str
    level: str  # request | server
    config_key: str
    replies: list[Reply] = field(default_factory=list)
    decision: str = "not-run"
    stopped: str = ""
    error: str = ""
    log_tail: str = ""
    launch_seconds: float = 0.0
    p_less: float | None = None
    p_value: float | None = None

    @property
    def n(self) -> int:
        return len([r for r in self.replies if not r.error])

    @property
    def failures(self) -> int:
        return len([r for r in self.replies if not r.error and r.failed])

    def kind_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for reply in self.replies:
            if reply.failed and not reply.error:
                counts.update(set(reply.kinds))
        return dict(counts)

    def outcome(self) -> cause_rules.ArmOutcome:
        return cause_rules.ArmOutcome(
            name=self.name,
            n=self.n,
            failures=self.failures,
            decision="errored" if self.error and self.n == 0 else self.decision,
            p_value=self.p_less,
            kind_counts=self.kind_counts(),
            raw_misplaced=sum(1 for r in self.replies if r.failed and r.raw_misplaced),
            error=self.error,
        )

    def speed(self) -> float | None:
        rates = [
            float(r.timings["predicted_per_second"])
            for r in self.replies
            if isinstance(r.timings.get("predicted_per_second"), (int, float))
        ]
        return round(sum(rates) / len(rates), 2) if rates else None

    def server_seconds(self) -> float:
        total = 0.0
        for reply in self.replies:
            t = reply.timings
            total += float(t.get("prompt_ms", 0) or 0) + float(t.get("predicted_ms", 0) or 0)
        return total / 1000.0

    def summary(self) -> dict[str, Any]:
        ci = wilson(self.failures, self.n)
        draft_n = sum(int(r.timings.get("draft_n", 0) or 0) for r in self.replies)
        accepted = sum(int(r.timings.get("draft_n_accepted", 0) or 0) for r in self.replies)
        return {
            "type": "arm",
            "arm": self.name,
            "variant": self.variant,
            "level": self.level,
            "n": self.n,
            "failures": self.failures,
            "rate": round(self.failures / self.n, 4) if self.n else None,
            "ci95": ci.as_list(),
            "p_value": None if self.name == "baseline" else _round(self.p_value),
            "p_less": None if self.name == "baseline" else _round(self.p_less),
            "decision": "baseline" if self.name == "baseline" else self.outcome().decision,
            "stopped": self.stopped,
            "errors": len([r for r in self.replies if r.error]),
            "error": self.error,
            "log_tail": self.log_tail,
            "kinds": self.kind_counts(),
            "speed_tok_s": self.speed(),
            "server_seconds": round(self.server_seconds(), 3),
            "launch_seconds": round(self.launch_seconds, 3),
            "draft_n": draft_n,
            "draft_n_accepted": accepted,
            "draft_acceptance": round(accepted / draft_n, 4) if draft_n else None,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


# --------------------------------------------------------------------------- adapters
# The only places that know the capture/symptom and llama APIs.


def classify_reply(request: dict[str, Any], status: int | None, body: Any,
                   elapsed: float, *, timed_out: bool = False) -> tuple[bool, list[str]]:
    """Is this reply a failure, and which failure kinds does it show? (capture + symptoms)"""
    from triage.capture import CaptureError, exchange_from_http
    from triage.symptoms import USER_FACING_KINDS, failure_kinds

    try:
        exchange = exchange_from_http(request, body, status=status, elapsed_ms=elapsed * 1000,
                                      timed_out=timed_out)
    except CaptureError:
        return True, ["http-error"]
    kinds = failure_kinds(exchange)
    # A reply fails when its user would see it broken (symptoms.USER_FACING_KINDS); the
    # diagnostic kinds (runaway reasoning) are kept to explain a failure but do not fail a
    # reply on their own.
    return bool(kinds & USER_FACING_KINDS), sorted(kinds)


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    key: str
    config: ServerConfig
    base_url: str
    slots: int
    launch_seconds: float
    handle: Any = None  # RunningServer, None for an external url

    def alive(self) -> bool:
        return self.handle is None or bool(self.handle.alive())

    def log_tail(self) -> str:
        if self.handle is None:
            return ""
        try:
            return str(self.handle.log_tail(20))
        except Exception:  # noqa: BLE001 - best effort for an error message
            return ""


@contextmanager
def open_server(config: ServerConfig, log_dir: Path, ready_timeout: float) -> Iterator[Server]:
    """Launch (or attach to) one server configuration; always stopped on exit."""
    if config.model is None and config.url:
        yield Server(config.key(), config, config.url.rstrip("/"), 1, 0.0)
        return
    from triage.llama.build import find_server_binary
    from triage.llama.launcher import ServerSpec, launch

    binary = config.binary
    if binary is None or "/" not in str(binary):
        binary = find_server_binary() if binary is None else _which(binary)
    assert config.model is not None
    spec = ServerSpec(binary=Path(binary), model=Path(config.model), args=list(config.args))
    with launch(spec, log_dir=log_dir, ready_timeout=ready_timeout) as running:
        yield Server(config.key(), config, running.base_url, 1,
                     float(getattr(running, "launch_seconds", 0.0)), running)


def _which(name: Path) -> Path:
    import shutil

    found = shutil.which(str(name))
    if found is None:
        from triage.llama.build import find_server_binary

        if str(name) == "llama-server":
            return find_server_binary()
        raise EngineError(f"binary {name!r} not found on PATH")
    return Path(found)


# --------------------------------------------------------------------------- the run


async def _score_one(client: Any, arm: ArmState, body: dict[str, Any], index: int, seed: int,
                     sem: asyncio.Semaphore) -> Reply:
    """Send one replicate and score it (failure kinds, lengths, timings)."""
    from triage.llama.client import LlamaClientError

    async with sem:
        started = time.monotonic()
        try:
            result = await client.chat(body)
        except LlamaClientError as exc:
            elapsed = time.monotonic() - started
            kind = "timeout" if getattr(exc, "kind", "") == "timeout" else "http-error"
            return Reply(arm.name, index, seed, True, [kind], None, 0, 0, None, elapsed, {},
                         error=str(exc))
    payload = result.json
    failed, kinds = classify_reply(
        body, result.status_code, payload if payload is not None else result.raw,
        result.elapsed)
    message = message_of(payload)
    timings = dict(payload.get("timings") or {}) if isinstance(payload, dict) else {}
    return Reply(
        arm.name, index, seed, failed, kinds, finish_reason_of(payload),
        len(str(message.get("content") or "")),
        len(str(message.get("reasoning_content") or "")),
        result.status_code, result.elapsed, timings,
        raw_misplaced=raw_misplaced(payload), text=committed_text(payload),
    )


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
        self.store = store
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
        self.run_id = run_id
        self.schedule = self.options.looks or look_schedule(self.options.max_requests)
        self.arms: dict[str, ArmState] = {}
        self.observations: dict[str, dict[str, Any]] = {}
        self.evidence_keys: dict[str, str] = {}  # arm/observation name -> evidence key
        self.servers: dict[str, Server] = {}
        self.started = time.monotonic()
        self.log_dir = self.options.log_dir or (data_dir() / "runs")

    # -- bookkeeping ---------------------------------------------------------------------
    def _emit(self, stage: str, message: str, done: int = 0, total: int = 0) -> None:
        self.progress(ProgressEvent(stage, message, done, total))

    def _prepare_incident(self) -> None:
        """Create/find the incident, the catalogue causes and the run row (one transaction)."""
        with self.store.session() as session:
            incident = get_incident(session, self.incident_slug) if self.incident_slug else None
            if incident is None:
                incident = self._new_incident(session)
            assert incident.id is not None
            self.incident_id = incident.id
            self.incident_slug = incident.slug
            existing = {
                c.key: c
                for c in session.exec(select(Cause).where(Cause.incident_id == incident.id))
            }
            for cause_id in CAUSE_CATALOGUE_IDS:
                if cause_id in existing:
                    continue
                cause = Cause(
                    incident_id=incident.id,
                    key=cause_id,
                    catalogue_id=cause_id,
                    title=cause_rules.CATALOGUE[cause_id]["title"],
                    status="suspected",
                    basis="untested",
                    rationale="candidate from the catalogue; not yet probed",
                )
                record_status_change(
                    session, cause, "suspected", actor=self.options.actor,
                    rationale="candidate cause from the catalogue, before any probe",
                )
            if self.run_id is None:
                if self.exchange:
                    evidence = add_evidence(
                        session,
                        incident_id=incident.id,
                        kind="exchange",
                        summary=self._exchange_summary(),
                        payload={"exchange": self.exchange, "findings": self.findings},
                        source=str(self.exchange.get("source_file") or ""),
                    )
                    self.evidence_keys["exchange"] = evidence.key
                    self._symptoms(session, incident.id, evidence.key)
                run = TriageRun(
                    incident_id=incident.id,
                    plan={
                        "request": self.request,
                        "stack": self.stack.raw,
                        "stack_source": self.stack.source,
                        "options": {
                            "max_requests": self.options.max_requests,
                            "seed": self.options.seed,
                        },
                        "exchange_evidence": self.evidence_keys.get("exchange"),
                        "findings": self.findings,
                    },
                )
                session.add(run)
                session.flush()
                self.run_id = run.id

    def _exchange_summary(self) -> str:
        kinds = [f["kind"] for f in self.findings if not f.get("passed", True)]
        return "failing exchange: " + (", ".join(kinds) if kinds else "no failed finding")

    def _new_incident(self, session: Session) -> Incident:
        model = Path(str(self.stack.server.model or self.stack.server.url or "server")).stem
        kinds = [f["kind"] for f in self.findings if not f.get("passed", True)]
        today = utcnow().date()
        base = f"{today.isoformat()}-{_slugify(model)}-{kinds[0] if kinds else 'failure'}"
        slug, suffix = base, 2
        while get_incident(session, slug) is not None:
            slug = f"{base}-{suffix}"
            suffix += 1
        incident = Incident(
            slug=slug,
            title=f"{model}: {', '.join(kinds) or 'failing exchange'}",
            opened_on=today,
            status="open",
            summary="Opened by `triage diagnose` from a failing exchange.",
            model=model,
            weights=Path(str(self.stack.server.model or "")).name,
            flags=list(self.stack.server.args),
            stack={"server": self.stack.server.describe(), "speculative": self.stack.speculative},
        )
        session.add(incident)
        session.flush()
        return incident

    def _symptoms(self, session: Session, incident_id: int, evidence_key: str) -> None:
        existing = {s.key for s in session.exec(
            select(Symptom).where(Symptom.incident_id == incident_id))}
        for finding in self.findings:
            if finding.get("passed", True) or finding["kind"] in existing:
                continue
            session.add(Symptom(
                incident_id=incident_id, key=finding["kind"], kind=finding["kind"],
                description=str(finding.get("reason", finding["kind"])),
                observed={"score": finding.get("score"), "where": finding.get("where")},
                evidence_keys=[evidence_key],
            ))
        session.flush()

    def _load_previous(self) -> None:
        """Resume: take the replies this run already recorded."""
        from kb.models import Evidence

        with self.store.session(readonly=True) as session:
            rows = session.exec(
                select(Evidence).where(Evidence.run_id == self.run_id, Evidence.kind == "probe")
            ).all()
        for row in rows:
            payload = row.payload or {}
            if payload.get("type") != "reply":
                continue
            reply = Reply.from_payload(payload)
            arm = self.arms.get(reply.arm)
            if arm is not None and all(r.index != reply.index for r in arm.replies):
                arm.replies.append(reply)

    # -- requests --------------------------------------------------------------------------
    async def _top_up(self, server: Server, arm: ArmState, target: int,
                      transform: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Bring `arm` to `target` replies on `server` (seeds base+index: paired across arms)."""
        from triage.llama.client import LlamaClient

        have = {r.index for r in arm.replies}
        todo = [i for i in range(target) if i not in have]
        if not todo:
            return
        if not server.alive():
            raise _ServerDied(server)
        sem = asyncio.Semaphore(self._concurrency(server))
        client = LlamaClient(server.base_url, timeout=self.options.request_timeout)
        try:
            tasks = []
            for index in todo:
                seed = self.options.seed + index
                body = probes.replay_body(transform(self.request), seed)
                tasks.append(_score_one(client, arm, body, index, seed, sem))
            replies = await asyncio.gather(*tasks)
        finally:
            await client.aclose()
        if any(r.error for r in replies) and not server.alive():
            raise _ServerDied(server)
        arm.replies.extend(replies)
        self._record_replies(replies)

    def _concurrency(self, server: Server) -> int:
        if self.options.concurrency:
            return self.options.concurrency
        return max(1, min(server.slots, 4))

    def _record_replies(self, replies: list[Reply]) -> None:
        items = []
        for reply in replies:
            verdict = "FAIL " + ",".join(reply.kinds) if reply.failed else "ok"
            items.append({
                "kind": "probe",
                "summary": (f"{reply.arm} #{reply.index} seed {reply.seed}: {verdict} "
                            f"(finish={reply.finish_reason}, content {reply.content_chars} "
                            f"chars, reasoning {reply.reasoning_chars} chars)"),
                "payload": reply.payload(),
                "source": "triage diagnose",
            })
        with self.store.session() as session:
            add_evidence_many(session, self.incident_id, items, run_id=self.run_id)

    # -- arms -------------------------------------------------------------------------------
    async def _run_sequential(
        self,
        base_server: Server,
        arm_servers: dict[str, Server],
        transforms: dict[str, Callable[[dict[str, Any]], dict[str, Any]]],
    ) -> None:
        """Looks at 4, 8, 16, ... replays per arm until every arm is decided or capped."""
        baseline = self.arms["baseline"]
        active = [name for name in transforms if name != "baseline"
                  and self.arms[name].decision in ("not-run", "undecided")]
        for look, target in enumerate(self.schedule):
            if not active:
                break
            self._emit("probe", f"look {look + 1}/{len(self.schedule)}: {target} replays for "
                       + ", ".join(active), look + 1, len(self.schedule))
            jobs = [self._top_up(base_server, baseline, target, transforms["baseline"])]
            for name in active:
                jobs.append(self._top_up(arm_servers[name], self.arms[name], target,
                                         transforms[name]))
            results = await asyncio.gather(*jobs, return_exceptions=True)
            for result in results:
                if isinstance(result, _ServerDied):
                    self._mark_died(result.server, active)
                elif isinstance(result, BaseException):
                    raise result
            if baseline.error:
                for name in active:
                    self.arms[name].decision = "undecided"
                    self.arms[name].stopped = "baseline server failed"
                return
            still = []
            for name in active:
                arm = self.arms[name]
                if arm.error:
                    continue
                cmp = compare(baseline.failures, baseline.n, arm.failures, arm.n,
                              looks=len(self.schedule), paired=_paired(baseline, arm))
                arm.p_less, arm.p_value = cmp.p_less, cmp.p_two_sided
                arm.decision = cmp.decision
                if cmp.decision in ("removes", "unchanged", "no-baseline-failure"):
                    arm.stopped = f"decided at look {look + 1} (n={arm.n})"
                elif (moot := self._moot(name)) is not None:
                    arm.stopped = f"stopped at n={arm.n}: not needed, {moot}"
                else:
                    arm.stopped = f"cap of {self.options.max_requests} reached"
                    still.append(name)
            active = still

    def _moot(self, name: str) -> str | None:
        """Why more replays of this arm cannot change any verdict (None: they can).

        token-limit-x4 and reasoning-budget only decide causes of length stops; and raising
        max_tokens is no evidence once thinking off already succeeds at the original limit."""
        baseline = self.arms["baseline"]
        if name in ("token-limit-x4", "reasoning-budget") and baseline.failures >= 4 \
                and not baseline.kind_counts().get("length-stop"):
            return f"none of the baseline's {baseline.failures} failures is a length stop"
        thinking_off = self.arms.get("thinking-off")
        if name == "token-limit-x4" and thinking_off is not None \
                and thinking_off.decision == "removes":
            return "thinking off already removes the failure at the original max_tokens"
        return None

    def _mark_died(self, server: Server, active: list[str]) -> None:
        tail = server.log_tail()
        code = getattr(server.handle, "returncode", None) if server.handle else None
        message = f"server {server.config.describe()} died (exit code {code})"
        for arm in self.arms.values():
            if arm.config_key == server.key and not arm.error:
                arm.error = message
                arm.log_tail = tail
                arm.decision = "errored"
                arm.stopped = "server crashed"

    # -- observations ------------------------------------------------------------------------
    # -- main ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._prepare_incident()
        request_arms = probes.request_arms(self.request)
        server_arms = probes.server_arms(self.stack)
        incident_key = self.stack.server.key()
        for arm in request_arms:
            self.arms[arm.name] = ArmState(arm.name, arm.variant, "request", incident_key)
        for sarm in server_arms:
            self.arms[sarm.name] = ArmState(sarm.name, sarm.variant, "server", sarm.config.key())
        kg_dims = probes.known_good_dimensions(self.stack)
        self._load_previous()
        self._emit("plan", f"{len(request_arms)} request arms, {len(server_arms)} server arms"
                   + (f", known-good search over {sorted(kg_dims)}" if kg_dims else ""))
        log_dir = self.log_dir / f"run-{self.run_id}"
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._run_all(request_arms, server_arms, kg_dims, incident_key, log_dir)
        except KeyboardInterrupt:
            self._set_state("interrupted")
            raise
        except EngineError:
            self._set_state("failed", finished=True)
            raise
        return self._finish()

    def _set_state(self, state: str, *, finished: bool = False) -> None:
        with self.store.session() as session:
            run = session.get(TriageRun, self.run_id)
            if run is not None:
                run.state = state
                if finished:
                    run.finished_at = utcnow()
                session.add(run)

    def _run_all(self, request_arms: list[probes.RequestArm], server_arms: list[probes.ServerArm],
                 kg_dims: dict[str, tuple[Any, Any]], incident_key: str, log_dir: Path) -> None:
        with ExitStack() as stack:
            self._emit("launch", "starting the incident's server")
            try:
                base = stack.enter_context(open_server(
                    self.stack.server, log_dir / "incident", self.options.ready_timeout))
            except Exception as exc:
                raise EngineError(f"the incident's server did not start: {exc}") from exc
            self.servers[incident_key] = base
            for arm in self.arms.values():
                if arm.level == "request":
                    arm.launch_seconds = base.launch_seconds
            asyncio.run(observe.observe_server(base, self.request, self.observations,
                                              seed=self.options.seed,
                                              timeout=self.options.request_timeout))
            transforms = {a.name: a.transform for a in request_arms}
            asyncio.run(self._run_sequential(
                base, {name: base for name in transforms}, transforms))
            for sarm in server_arms:
                self._run_server_arm(sarm.name, sarm.config, base, log_dir)
            if kg_dims:
                self._known_good_search(kg_dims, base, log_dir)

    def _run_server_arm(self, name: str, config: ServerConfig, base: Server,
                        log_dir: Path) -> None:
        arm = self.arms[name]
        self._emit("launch", f"starting server for {name}")
        try:
            with open_server(config, log_dir / name, self.options.ready_timeout) as server:
                arm.launch_seconds = server.launch_seconds
                self.servers[server.key] = server
                if name == "spec-off":
                    asyncio.run(observe.spec_divergence(
                        base, server, self.request, self.observations, seed=self.options.seed,
                        seeds=self.options.divergence_seeds,
                        timeout=self.options.request_timeout))
                if name == "alt-weights":
                    asyncio.run(observe.weights_confounder(
                        base, server, self.request, self.observations,
                        timeout=self.options.request_timeout))
                identity = {"baseline": copy.deepcopy, name: copy.deepcopy}
                asyncio.run(self._run_sequential(base, {name: server}, identity))
        except Exception as exc:  # noqa: BLE001 - a failed launch is an errored arm
            if not arm.error:
                arm.error = f"{type(exc).__name__}: {exc}"
                arm.log_tail = str(getattr(exc, "log_tail", ""))
                arm.decision = "errored"
                arm.stopped = "server failed"

    def _known_good_search(self, dims: dict[str, tuple[Any, Any]], base: Server,
                           log_dir: Path) -> None:
        """Delta debugging over the changed dimensions, each configuration by the same
        sequential rule: first each dimension reverted alone, then (if none alone removes the
        failure) pairs, then the full known-good configuration."""
        names = sorted(dims)
        tried: dict[str, set[str]] = {}
        for dim in names:
            tried[f"known-good:revert-{dim}"] = {dim}
        for arm_name, subset in tried.items():
            self._kg_arm(arm_name, subset, base, log_dir)
        if not any(self.arms[a].decision == "removes" for a in tried) and len(names) > 2:
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    arm_name = f"known-good:revert-{a}+{b}"
                    tried[arm_name] = {a, b}
                    self._kg_arm(arm_name, {a, b}, base, log_dir)
        self._kg_arm("known-good", set(names), base, log_dir)
        needed = sorted({d for a, subset in tried.items()
                         if self.arms[a].decision == "removes" for d in subset
                         if len(subset) == 1})
        if not needed:
            pairs = [sorted(s) for a, s in tried.items()
                     if self.arms[a].decision == "removes" and len(s) == 2]
            needed = sorted({d for pair in pairs for d in pair})
        self.observations["known-good-search"] = {
            "name": "known-good-search",
            "dimensions": {k: [str(v[0]), str(v[1])] for k, v in dims.items()},
            "needed_to_reproduce": needed,
            "known_good_removes": self.arms["known-good"].decision == "removes",
            "arms": {a: self.arms[a].decision for a in [*tried, "known-good"]},
        }

    def _kg_arm(self, name: str, subset: set[str], base: Server, log_dir: Path) -> None:
        config = probes.revert_dimensions(self.stack, subset)
        variant = "known-good values for: " + ", ".join(sorted(subset))
        self.arms[name] = ArmState(name, variant, "server", config.key())
        self._run_server_arm(name, config, base, log_dir)

    # -- results -----------------------------------------------------------------------------
    def _finish(self) -> dict[str, Any]:
        obs = self._observations_for_rules()
        outcomes = {name: arm.outcome() for name, arm in self.arms.items()}
        verdicts = cause_rules.decide(outcomes, obs)
        with self.store.session() as session:
            for name, arm in self.arms.items():
                if arm.n == 0 and not arm.error:
                    continue
                summary = arm.summary()
                evidence = add_evidence(
                    session, incident_id=self.incident_id, kind="measurement",
                    summary=(f"arm {name} ({arm.variant}): {arm.failures}/{arm.n} failed, "
                             f"95% CI {summary['ci95'][0]:.2f}-{summary['ci95'][1]:.2f}"
                             + (f", p={summary['p_value']}" if summary["p_value"] is not None
                                else "") + f"; {summary['decision']}"
                             + (f"; error: {arm.error}" if arm.error else "")),
                    payload=summary, source="triage diagnose", run_id=self.run_id,
                )
                self.evidence_keys[name] = evidence.key
            for name, facts in self.observations.items():
                evidence = add_evidence(
                    session, incident_id=self.incident_id, kind="observation",
                    summary=observe.observation_summary(name, facts),
                    payload={"type": "observation", **facts}, source="triage diagnose",
                    run_id=self.run_id,
                )
                self.evidence_keys[name] = evidence.key
            changes = self._apply_verdicts(session, verdicts)
            run = session.get(TriageRun, self.run_id)
            assert run is not None
            from kb.files import load_record
            from triage import graph as graph_mod

            assert self.incident_slug is not None
            record = load_record(session, self.incident_slug)
            graph_summary = graph_mod.summary(graph_mod.build_graph(record))
            diagnosis = self._diagnosis(verdicts, changes, graph_summary)
            run.result = diagnosis
            run.state = "done" if not any(a.error for a in self.arms.values()) else "partial"
            run.finished_at = utcnow()
            session.add(run)
        self._emit("done", f"diagnosis of {self.incident_slug} recorded")
        return diagnosis

    def _observations_for_rules(self) -> cause_rules.Observations:
        template = self.observations.get("template-render", {})
        confounder = self.observations.get("weights-confounder", {})
        return cause_rules.Observations(
            thinking_on_by_default=template.get("thinking_on"),
            deterministic=self.observations.get("determinism", {}).get("identical"),
            speculative_enabled=self.stack.speculative,
            divergence=self.observations.get("spec-divergence"),
            confounders=list(confounder.get("differs", [])),
            has_alt_weights=self.stack.alternate_model is not None,
            has_alt_binary=self.stack.alternate_binary is not None,
        )

    def _keys(self, names: list[str]) -> list[str]:
        return [self.evidence_keys[n] for n in names if n in self.evidence_keys]

    def _apply_verdicts(self, session: Session, verdicts: list[cause_rules.Verdict]
                        ) -> dict[str, str | None]:
        causes = {c.key: c for c in session.exec(
            select(Cause).where(Cause.incident_id == self.incident_id))}
        previous: dict[str, str | None] = {}
        for verdict in verdicts:
            cause = causes[verdict.cause]
            previous[verdict.cause] = cause.status
            keys = self._keys([*verdict.supports, *verdict.refutes])
            for relation, names in (("supports", verdict.supports),
                                    ("refutes", verdict.refutes)):
                for key in self._keys(names):
                    evidence = _evidence_id(session, self.incident_id, key)
                    exists = session.exec(select(EvidenceLink).where(
                        EvidenceLink.cause_id == cause.id,
                        EvidenceLink.evidence_id == evidence,
                        EvidenceLink.relation == relation)).first()
                    if exists is None:
                        session.add(EvidenceLink(cause_id=cause.id, evidence_id=evidence,
                                                 relation=relation, note=f"run {self.run_id}"))
            cause.rationale = verdict.rationale
            cause.deciding_probe = verdict.deciding_probe
            cause.basis = "measured" if verdict.status != "suspected" else (
                "untested" if "not testable" in verdict.rationale else "measured")
            if cause.status != verdict.status or verdict.status != "suspected":
                record_status_change(session, cause, verdict.status, actor=self.options.actor,
                                     rationale=verdict.rationale, evidence_keys=keys)
            session.add(cause)
        session.flush()
        return previous

    def _diagnosis(self, verdicts: list[cause_rules.Verdict],
                   previous: dict[str, str | None],
                   graph_summary: dict[str, Any]) -> dict[str, Any]:
        arms = []
        for name, arm in self.arms.items():
            if arm.n == 0 and not arm.error:
                continue
            summary = arm.summary()
            arms.append({
                "name": name, "variant": arm.variant, "level": arm.level, "n": arm.n,
                "failures": arm.failures, "rate": summary["rate"], "ci95": summary["ci95"],
                "p_value": summary["p_value"], "decision": summary["decision"],
                "stopped": arm.stopped, "error": arm.error or None,
                "speed_tok_s": summary["speed_tok_s"],
                "draft_acceptance": summary["draft_acceptance"],
                "evidence": self.evidence_keys.get(name),
            })
        causes = []
        for verdict in verdicts:
            causes.append({
                "id": verdict.cause, "status": verdict.status, "rationale": verdict.rationale,
                "evidence": self._keys([*verdict.supports, *verdict.refutes]),
                "deciding_probe": verdict.deciding_probe,
                "previous_status": previous.get(verdict.cause),
                "undecided": verdict.undecided or None,
            })
        undecided = [f"{v.cause}: {v.undecided}" for v in verdicts if v.status == "suspected"]
        undecided += [f"arm {a.name} errored: {a.error}" for a in self.arms.values() if a.error]
        requests = sum(len(a.replies) for a in self.arms.values())
        wall = time.monotonic() - self.started
        server_seconds = sum(a.server_seconds() for a in self.arms.values())
        launch_seconds = sum(s.launch_seconds for s in self.servers.values())
        return {
            "schema_version": 1,
            "incident": self.incident_slug,
            "run_id": self.run_id,
            "generated_at": utcnow().isoformat(),
            "exchange_evidence": self.evidence_keys.get("exchange"),
            "findings": self.findings,
            "stack": {"server": self.stack.server.describe(),
                      "speculative": self.stack.speculative,
                      "alternate_model": str(self.stack.alternate_model or "") or None,
                      "alternate_binary": str(self.stack.alternate_binary or "") or None,
                      "known_good": self.stack.known_good.describe()
                      if self.stack.known_good else None},
            "arms": arms,
            "observations": [{**facts, "evidence": self.evidence_keys.get(name)}
                             for name, facts in self.observations.items()],
            "causes": causes,
            "undecided": undecided,
            "graph": graph_summary,
            "cost": {"requests": requests, "wall_seconds": round(wall, 3),
                     "server_seconds": round(server_seconds, 3),
                     "launch_seconds": round(launch_seconds, 3)},
        }


def _paired(baseline: ArmState, arm: ArmState) -> tuple[int, int]:
    """(baseline failures among seed-matched replays, how many of those the arm fixed)."""
    base = {r.index: r for r in baseline.replies if not r.error}
    pairs = [(base[r.index], r) for r in arm.replies if not r.error and r.index in base]
    failing = [(b, a) for b, a in pairs if b.failed]
    return len(failing), sum(1 for _, a in failing if not a.failed)


class _ServerDied(Exception):
    def __init__(self, server: Server) -> None:
        super().__init__(f"server {server.key} died")
        self.server = server


def _evidence_id(session: Session, incident_id: int, key: str) -> int:
    from kb.models import Evidence

    row = session.exec(select(Evidence.id).where(
        Evidence.incident_id == incident_id, Evidence.key == key)).one()
    return int(row)


def _slugify(text: str) -> str:
    out = "".join(ch.lower() if ch.isalnum() else "-" for ch in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:60] or "server"


def diagnose(
    store: Store,
    stack: Stack,
    request: dict[str, Any],
    *,
    exchange: dict[str, Any] | None = None,
    findings: list[dict[str, Any]] | None = None,
    incident: str | None = None,
    options: DiagnoseOptions | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Run the probes for one failing request against one stack; returns the diagnosis."""
    return Diagnoser(store, stack, request, exchange=exchange, findings=findings,
                     incident=incident, options=options, progress=progress).run()


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


def replay_rate(
    stack: Stack,
    request_bodies: list[dict[str, Any]],
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
    schedule = look_schedule(max_requests) if baseline else [max_requests]
    arm = ArmState("replay", "recorded requests on the current stack", "server",
                   stack.server.key())
    runs_dir = log_dir or (data_dir() / "runs" / "replay")

    async def top_up(server: Server, target: int) -> None:
        from triage.llama.client import LlamaClient

        sem = asyncio.Semaphore(max(1, min(server.slots, 4)))
        client = LlamaClient(server.base_url, timeout=request_timeout)
        try:
            tasks = []
            for index in range(arm.n, target):
                body_source = request_bodies[index % len(request_bodies)]
                body = probes.replay_body(body_source, seed + index)
                tasks.append(_score_one(client, arm, body, index, seed + index, sem))
            arm.replies.extend(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    try:
        with open_server(stack.server, runs_dir, 60.0) as server:
            for target in schedule:
                asyncio.run(top_up(server, target))
                if not server.alive():
                    arm.error = f"server died (log tail: {server.log_tail()[-500:]})"
                    break
                if baseline is None:
                    continue
                cmp = compare(baseline[0], baseline[1], arm.failures, arm.n,
                              looks=len(schedule))
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
    summary = arm.summary()
    return ArmResult(
        n=arm.n, failures=arm.failures, rate=summary["rate"], ci95=summary["ci95"],
        p_value=arm.p_less if baseline else None, decision=arm.decision,
        kinds=arm.kind_counts(), error=arm.error, speed_tok_s=arm.speed(),
    )


def latest_diagnosis(store: Store, slug: str) -> dict[str, Any] | None:
    """The result of the incident's latest finished run."""
    with store.session(readonly=True) as session:
        incident = get_incident(session, slug)
        if incident is None:
            return None
        run = session.exec(
            select(TriageRun).where(TriageRun.incident_id == incident.id,
                                    TriageRun.finished_at.is_not(None))  # type: ignore[union-attr]
            .order_by(TriageRun.id.desc())  # type: ignore[union-attr]
        ).first()
        return dict(run.result) if run else None


def unfinished_run(store: Store, slug: str | None) -> TriageRun | None:
    """The latest run without a result (interrupted), optionally of one incident."""
    with store.session(readonly=True) as session:
        query = select(TriageRun).where(TriageRun.finished_at.is_(None))  # type: ignore[union-attr]
        if slug:
            incident = get_incident(session, slug)
            if incident is None:
                return None
            query = query.where(TriageRun.incident_id == incident.id)
        return session.exec(query.order_by(TriageRun.id.desc())).first()  # type: ignore[union-attr]


def resume(store: Store, run: TriageRun, stack: Stack, *, options: DiagnoseOptions | None = None,
           progress: ProgressFn | None = None) -> dict[str, Any]:
    """Continue an interrupted run from the replies it already recorded."""
    with store.session(readonly=True) as session:
        incident = session.get(Incident, run.incident_id)
        assert incident is not None
        slug = incident.slug
    diagnoser = Diagnoser(store, stack, dict(run.plan["request"]), incident=slug,
                          findings=list(run.plan.get("findings") or []),
                          options=options, progress=progress, run_id=run.id)
    if run.plan.get("exchange_evidence"):
        diagnoser.evidence_keys["exchange"] = str(run.plan["exchange_evidence"])
    return diagnoser.run()


def today() -> date:
    return utcnow().date()
