"""`triage diagnose`, `triage show`, `triage demo`: the engine from the command line."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from kb.atlas.match import Match
from kb.domain.diagnosis import (
    Diagnosis,
    DiagnosisArm,
    Observation,
    ServerSummary,
)
from kb.jsontypes import JsonObject
from kb.repo.runs import RunOwner, resumable_runs, run_incident_slug
from kb.repo.store import Store, evidence_payloads
from triage.atlas.report import diagnosis_matches, format_match_dicts, format_matches
from triage.capture import CaptureError, load_file, read_file
from triage.checks.prompt_cache_turns import conversation_intake
from triage.commands import open_store, with_options
from triage.commands.ui import start_ui
from triage.demo import run_demo
from triage.engine import (
    ArmsPlanned,
    DiagnoseOptions,
    EngineError,
    Event,
    Intake,
    diagnose,
    latest_diagnosis,
    latest_run_state,
    run_to_resume,
)
from triage.engine import resume as resume_run
from triage.observe import observation_summary
from triage.stackfile import Stack, StackError, load_stack
from triage.symptoms import is_failure

__all__ = ["ProgressPrinter", "format_diagnosis", "register"]


# The observations a diagnosis prints, as sentences (the rest stay in --json / the record).
# A diagnosis whose failure reproduced but that confirmed no cause (issue 23): its own
# verdict and exit status (1 = error / not reproduced / partial, 2 = usage, 3 = check).
UNEXPLAINED = "unexplained"
EXIT_UNEXPLAINED = 4

_PRINTED_OBSERVATIONS = (
    "template-render",
    "spec-divergence",
    "weights-confounder",
    "known-good-search",
)
TOK_S_NOTE = (
    "tok/s: the arm's mean decode speed (llama-server's predicted tokens per second over "
    "its replies), on this machine at its load then -- what a fix would cost or gain; "
    "server arms run on their own server (spec-off has no draft model to run), so compare "
    "each with the baseline, not with one another."
)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    return f"{minutes}:{secs:02d}"


class ProgressPrinter:
    """Progress lines on stderr with the elapsed time and, once replays have been timed, an
    ETA as a bound: the engine's (ProgressEvent.eta, triage.engine.eta) -- the replays still
    possible times the measured time of one replay over the replays run at once; arms
    usually decide sooner, so the run usually ends well before it. No bound is printed
    until one was measured. `clock` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.monotonic
        self.started: float | None = None
        self.known_good = False

    def __call__(self, event: Event) -> None:
        now = self.clock()
        if self.started is None:
            self.started = now
        if isinstance(event, ArmsPlanned):
            self.known_good = bool(event.known_good)  # its arms are planned later
        eta = event.eta
        bar = ""
        if event.total:
            filled = int(20 * event.done / event.total)
            bar = "[" + "#" * filled + "." * (20 - filled) + f"] {event.done}/{event.total} "
        timing = f"  ({_clock(now - self.started)} elapsed"
        if eta is not None:
            extra = " + the known-good search" if self.known_good else ""
            timing += f", at most ~{_clock(eta)} left at the measured pace{extra}"
        timing += ")"
        click.echo(f"  {event.stage:7} {bar}{event.message}{timing}", err=True)


def _progress_printer() -> ProgressPrinter:
    return ProgressPrinter()


def with_one_sided_p(store: Store, diagnosis: Diagnosis) -> Diagnosis:
    """A copy of the diagnosis for printing, each arm with the one-sided p (`p_less`) its
    decision used, read from the arm's stored measurement (older diagnoses keep the
    two-sided `p_value` only)."""
    keys = [str(arm.evidence) for arm in diagnosis.arms if arm.evidence]
    try:
        with store.session(readonly=True) as session:
            payloads = evidence_payloads(session, diagnosis.incident, keys)
    except Exception:  # noqa: BLE001 -- printing falls back to the two-sided p, labelled
        payloads = {}
    arms = []
    for arm in diagnosis.arms:
        stored = payloads.get(str(arm.evidence), {}).get("p_less")
        if arm.p_less is None and stored is not None:
            arm = dataclasses.replace(arm, p_less=float(stored))
        arms.append(arm)
    return dataclasses.replace(diagnosis, arms=arms)


def _p_text(arm: DiagnosisArm) -> str:
    """The one-sided p the arm's decision uses ("the arm fails less"); older diagnoses
    carry only the two-sided one, printed as such."""
    if arm.p_less is not None:
        return f"  p={arm.p_less:.2g}"
    if arm.p_value is not None:
        return f"  p(two-sided)={arm.p_value:.2g}"
    return ""


def observation_sentence(obs: Observation) -> str:
    """One observation as a sentence for people, with the evidence id it was stored as."""
    name = obs.name
    facts = {k: v for k, v in obs.facts.items() if k not in ("name", "prompt_tail", "evidence")}
    if name in _PRINTED_OBSERVATIONS or facts.get("error"):
        text = observation_summary(name, facts)
    else:
        parts = [f"{k.replace('_', ' ')} {_plain(v)}" for k, v in facts.items()]
        text = f"{name}: " + ("; ".join(parts) or "recorded")
    text = text[:1].upper() + text[1:]
    evidence = f" [{obs.evidence}]" if obs.evidence else ""
    return text.rstrip(".") + "." + evidence


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) or "none"
    return str(value)


def stack_line(server: ServerSummary) -> str:
    """The run's server in one line (recorded with secrets masked): model file and args,
    or the URL of a running server."""
    if server.model:
        name = str(server.model).rsplit("/", 1)[-1]
        return f"{name} {' '.join(server.args)}".strip()
    return f"running server at {server.url}"


def format_diagnosis(diagnosis: Diagnosis, atlas: Sequence[Match] = ()) -> str:
    """The diagnosis as text for a terminal, with the atlas's pointers beside it."""
    lines = [f"Diagnosis of {diagnosis.incident} (run {diagnosis.run_id})", ""]
    stack = diagnosis.stack
    if stack is not None and stack.server is not None and (stack.server.model or stack.server.url):
        lines[1:1] = [f"stack: {stack_line(stack.server)}"]
    if stack is not None and stack.host_workaround:
        lines[1:1] = [f"note: {stack.host_workaround} (drill servers only)"]
    reproduction = diagnosis.reproduction
    if reproduction is not None and not reproduction.reproduced:
        lines += [f"NOT REPRODUCED: {reproduction.message}", ""]
    verdict = diagnosis.verdict
    if verdict is not None and verdict.status == UNEXPLAINED:
        lines += [verdict.headline, f"  {verdict.ruled_out}", "  next:"]
        lines += [f"    - {probe}" for probe in verdict.next_probes or []]
        lines.append("")
    failed = [f for f in diagnosis.findings if not f.passed]
    if failed:
        lines.append("Findings in the failing exchange:")
        lines += [f"  - {f.kind}: {f.reason}" for f in failed]
        lines.append("")
    lines += _arm_lines(diagnosis.arms)
    if diagnosis.skipped_arms:
        lines.append("Arms not run (they cannot matter here):")
        lines += [f"  {s.arm:<24} {s.reason}" for s in diagnosis.skipped_arms]
        lines.append("")
    for status in ("confirmed", "rejected", "suspected"):
        group = [c for c in diagnosis.causes if c.status == status]
        if not group:
            continue
        lines.append(f"{status.upper()}:")
        for cause in group:
            ev = ", ".join(cause.evidence) or "-"
            lines.append(f"  {cause.id}: {cause.rationale} [evidence: {ev}]")
        lines.append("")
    observed = [o for o in diagnosis.observations if o.name in _PRINTED_OBSERVATIONS]
    if observed:
        lines.append("Observations:")
        lines += [f"  - {observation_sentence(obs)}" for obs in observed]
        lines.append("")
    shown = format_match_dicts([m.to_dict() for m in atlas])
    if shown:
        lines += [*shown, ""]
    cost = diagnosis.cost
    if cost is not None:
        lines.append(
            f"cost: {cost.requests} requests, {cost.wall_seconds} s "
            f"wall, {cost.server_seconds} s server, "
            f"{cost.launch_seconds} s launches"
        )
    return "\n".join(lines).rstrip() + "\n"


def _arm_lines(arms: Sequence[DiagnosisArm]) -> list[str]:
    lines = [
        "Probe arms (failures k/n, rate, 95% Wilson interval, one-sided p that the arm fails "
        "less than the baseline, decision, decode tok/s):"
    ]
    speeds = False
    for arm in arms:
        rate = "-" if arm.rate is None else f"{arm.rate:.2f}"
        lo, hi = arm.ci95
        extra = ""
        if arm.speed_tok_s:
            speeds = True
            extra += f"  {arm.speed_tok_s:.0f} tok/s"
        if arm.draft_acceptance is not None:
            extra += f"  draft acceptance {arm.draft_acceptance:.0%}"
        if arm.error:
            extra += f"  ERROR: {arm.error}"
        elif not arm.n and arm.decision == "not-run":
            extra += f"  NOT RUN: {arm.stopped or 'no replay'}"
        lines.append(
            f"  {arm.name:<24} {arm.failures:>3}/{arm.n:<3} rate {rate}  "
            f"[{lo:.2f}, {hi:.2f}]{_p_text(arm)}  {arm.decision}{extra}"
        )
    if speeds:
        lines.append("  " + TOK_S_NOTE)
    return [*lines, ""]


def _load_exchange(
    request: Path, response: Path | None, fmt: str, pick: int | None = None
) -> Intake:
    try:
        if response is not None:
            exchanges = load_file(request, format=fmt, response=response)
        else:
            exchanges = load_file(request, format=fmt)
    except CaptureError as exc:
        if response is None and fmt in ("auto", "pair"):
            try:
                body = _request_only(read_file(request))
            except CaptureError:
                body = None
            if body is not None:  # reproduce from the request alone: no captured failure
                return Intake(body)
        raise click.ClickException(str(exc)) from None
    try:  # a capture of several exchanges: which one, and its conversation's turns
        chosen = conversation_intake(exchanges, file=str(request), pick=pick, failed=is_failure)
    except CaptureError as exc:
        raise click.ClickException(str(exc)) from None
    for line in chosen.notes:
        click.echo(line, err=True)
    intake = Intake.of(chosen.exchange)
    if chosen.finding is not None:  # the conversation's own finding joins the exchange's
        intake = dataclasses.replace(intake, findings=(*intake.findings, chosen.finding.record()))
    return intake


def _request_only(data: Any) -> JsonObject | None:
    """A bare chat request body (a JSON object), or None."""
    try:
        body = json.loads(data if isinstance(data, str) else bytes(data).decode("utf-8"))
    except (ValueError, TypeError):
        return None
    return body if isinstance(body, dict) and "response" not in body else None


def register(group: click.Group) -> None:
    group.add_command(diagnose_command)
    group.add_command(show_command)
    group.add_command(demo_command)


_DIAGNOSE_OPTIONS = (
    click.option(
        "--request",
        "request_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help="The failing request (JSON body), or any capture the capture layer reads.",
    ),
    click.option(
        "--response",
        "response_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help="Its response (JSON body or SSE transcript).",
    ),
    click.option(
        "--format",
        "fmt",
        default="auto",
        show_default=True,
        help="Capture format: auto|pair|curl|sse|har|jsonl.",
    ),
    click.option(
        "--stack",
        "stack_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help="stack.toml: how the failing server runs and what to compare it with.",
    ),
    click.option("--incident", default=None, help="Attach to this incident (default: a new one)."),
    click.option(
        "--max-requests",
        type=click.IntRange(4, 10000),
        default=None,
        help="Cap of replays per arm (sequential rule stops earlier when decided).",
    ),
    click.option("--seed", type=int, default=None, help="First seed of the replays."),
    click.option(
        "--exchange",
        "pick",
        type=click.IntRange(min=1),
        metavar="N",
        default=None,
        help="Diagnose the N-th exchange (from 1) of a capture that holds several (default: "
        "the last whose reply fails, else the last); the turns of its conversation before it "
        "are read for the unstable-prefix finding.",
    ),
    click.option(
        "--json",
        "json_out",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Write the diagnosis JSON here ('-' for stdout).",
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Continue your interrupted run of this --stack (and --request / --incident when "
        "given); never a run another process is still running.",
    ),
)


@click.command("diagnose")
@with_options(_DIAGNOSE_OPTIONS)
@click.pass_context
def diagnose_command(
    ctx: click.Context,
    request_path: Path | None,
    response_path: Path | None,
    fmt: str,
    stack_path: Path | None,
    incident: str | None,
    max_requests: int | None,
    seed: int | None,
    pick: int | None,
    json_out: Path | None,
    resume: bool,
) -> None:
    """Reproduce a failing exchange against its stack and decide which causes are real."""
    if stack_path is None:
        raise click.UsageError("--stack STACK.toml is required")
    try:
        stack = load_stack(stack_path)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    options = DiagnoseOptions()
    if max_requests:
        options.max_requests = max_requests
    if seed is not None:
        options.seed = seed
    with open_store(ctx) as store:
        diagnosis, matches = _run_diagnosis(
            store, request_path, response_path, fmt, stack, incident, options, resume, pick
        )
    if json_out is not None:
        # The atlas with the verdicts: an extra field beside them, never a change to them.
        # (The engine checked the diagnosis against its schema where it recorded it; the
        # atlas entries were checked against theirs when read.)
        data = {**diagnosis.to_json(), "atlas_matches": [m.to_dict() for m in matches]}
        text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
        if str(json_out) == "-":
            sys.stdout.write(text)
        else:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(text, "utf-8")
    if json_out is None or str(json_out) != "-":
        with open_store(ctx) as store:
            click.echo(format_diagnosis(with_one_sided_p(store, diagnosis), matches))
    _exit_for_state(diagnosis)


def _exit_for_state(diagnosis: Diagnosis) -> None:
    """A run that did not reproduce the failure or ended with errors exits non-zero (1); an
    UNEXPLAINED verdict (reproduced, nothing confirmed) exits EXIT_UNEXPLAINED (4)."""
    verdict = diagnosis.verdict
    if verdict is not None and verdict.status == UNEXPLAINED:
        sys.exit(EXIT_UNEXPLAINED)
    if diagnosis.state == "not-reproduced":
        reproduction = diagnosis.reproduction
        raise click.ClickException(reproduction.message if reproduction else "")
    if verdict is not None and verdict.status == "not-reproduced":
        raise click.ClickException(verdict.headline or "not reproduced")
    if diagnosis.state == "partial":
        raise click.ClickException(
            "the run ended with errors (see the arms marked ERROR or NOT RUN); continue it with "
            f"`triage diagnose --resume --incident {diagnosis.incident} --stack ...`"
        )


def _run_diagnosis(
    store: Store,
    request_path: Path | None,
    response_path: Path | None,
    fmt: str,
    stack: Stack,
    incident: str | None,
    options: DiagnoseOptions,
    resume: bool,
    pick: int | None = None,
) -> tuple[Diagnosis, list[Match]]:
    """The diagnosis, and the atlas's matches for it (pointers printed beside the verdicts)."""
    intake: Intake | None = None
    try:
        if resume:
            # The caller's own run: same stack (and request, incident when given), never one
            # another process is still running; ambiguity is refused with a list.
            wanted = None
            if request_path is not None:
                wanted = _load_exchange(request_path, response_path, fmt, pick).request
            run = run_to_resume(store, stack, request=wanted, incident=incident)
            label = (run.plan or {}).get("stack_label") or "stack not recorded"
            with store.session(readonly=True) as session:
                slug = run_incident_slug(session, run)
            click.echo(f"resuming run {run.id} of {slug} (stack: {label})", err=True)
            diagnosis = resume_run(store, run, stack, options=options, progress=_progress_printer())
        else:
            if request_path is None:
                raise click.UsageError("--request is required (or --resume)")
            intake = _load_exchange(request_path, response_path, fmt, pick)
            _print_atlas_before(stack, intake)
            diagnosis = diagnose(
                store,
                intake,
                stack,
                incident=incident,
                options=options,
                progress=_progress_printer(),
            )
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        raise click.ClickException(_interrupted_message(store)) from None
    exchange = intake.exchange if intake is not None else None
    matches, _, _ = diagnosis_matches(stack, exchange, diagnosis.findings, diagnosis.to_json())
    return diagnosis, matches


def _print_atlas_before(stack: Stack, intake: Intake) -> None:
    """Before probing: what the atlas says about the capture and the stack (on stderr, with
    the progress lines)."""
    matches, checked, warning = diagnosis_matches(stack, intake.exchange, intake.findings)
    lines = [f"warning: {warning}"] if warning else format_matches(matches, checked)
    for line in ["before probing:", *lines]:
        click.echo(line, err=True)


def _interrupted_message(store: Store) -> str:
    """What a Ctrl-C left behind: the run to resume, or nothing when it came before the
    run was recorded (the incident's server was still starting)."""
    me = RunOwner.current()
    try:
        with store.session() as session:
            mine = [
                c
                for c in resumable_runs(session)
                if (c.plan.get("owner") or {}).get("pid") == me.pid
                and (c.plan.get("owner") or {}).get("host") == me.host
            ]
    except Exception:  # noqa: BLE001 - the message must not fail the interrupt
        mine = []
    if not mine:
        return "interrupted before the run started: nothing was recorded, nothing to resume"
    run = mine[0]
    return (
        f"interrupted: run {run.id} of {run.slug} is recorded as interrupted; continue it "
        "with `triage diagnose --resume --stack ...`"
    )


@click.command("show")
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON.")
@click.pass_context
def show_command(ctx: click.Context, slug: str, as_json: bool) -> None:
    """Print the latest diagnosis of an incident."""
    with open_store(ctx) as store:
        stored = latest_diagnosis(store, slug)
        exists, state, label = latest_run_state(store, slug, with_stack=True)
        diagnosis = Diagnosis.from_json(stored) if stored is not None else None
        printable = with_one_sided_p(store, diagnosis) if diagnosis is not None else None
    if not exists:
        raise click.ClickException(f"no incident {slug!r} (see `triage incidents list`)")
    if stored is None or diagnosis is None:
        why = f"its latest run is {state}" if state else "no run recorded"
        if label:
            why += f" (stack: {label})"
        raise click.ClickException(
            f"no diagnosis recorded for {slug!r}: {why} (run `triage diagnose`"
            + (", or `triage diagnose --resume`" if state in ("interrupted", "partial") else "")
            + f", or see `triage incidents show {slug}`)"
        )
    if as_json:  # the row as stored
        click.echo(json.dumps(stored, indent=2, sort_keys=True, default=str))
    else:
        click.echo(format_diagnosis(printable or diagnosis))
    if diagnosis.state == "not-reproduced" or diagnosis.verdict_status == "not-reproduced":
        sys.exit(1)
    if diagnosis.verdict_status == UNEXPLAINED:
        sys.exit(EXIT_UNEXPLAINED)


@click.command("demo")
@click.option(
    "--dir",
    "work_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write the drill models (default: data dir).",
)
@click.option("--ui/--no-ui", default=False, help="Start the web UI afterwards.")
@click.option("--max-requests", type=click.IntRange(4, 10000), default=32, show_default=True)
@click.pass_context
def demo_command(ctx: click.Context, work_dir: Path | None, ui: bool, max_requests: int) -> None:
    """Diagnose the gemma4-thinking-budget drill (speculative draft + alternate weights)."""
    database = ctx.obj.get("database") if ctx.obj else None
    diagnosis = run_demo(
        database, work_dir, max_requests=max_requests, progress=_progress_printer()
    )
    with open_store(ctx) as store:
        click.echo(format_diagnosis(with_one_sided_p(store, diagnosis)))
    if ui:
        start_ui(database)
