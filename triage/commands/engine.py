"""`triage diagnose`, `triage show`, `triage demo`: the engine from the command line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kb.domain.records import validate_diagnosis
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
    diagnose,
    findings_json,
    latest_diagnosis,
    latest_run_state,
    run_to_resume,
)
from triage.engine import resume as resume_run
from triage.engine.intake import FINDING_KEYS
from triage.observe import observation_summary
from triage.stackfile import Stack, StackError, load_stack

__all__ = ["ProgressPrinter", "format_diagnosis", "register", "validate_diagnosis"]


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


def with_one_sided_p(store: Store, diagnosis: dict[str, Any]) -> dict[str, Any]:
    """A copy of the diagnosis for printing, each arm with the one-sided p (`p_less`) its
    decision used, read from the arm's stored measurement (the diagnosis JSON keeps the
    two-sided `p_value` only)."""
    arms = [dict(arm) for arm in diagnosis.get("arms", [])]
    keys = [str(arm["evidence"]) for arm in arms if arm.get("evidence")]
    try:
        with store.session(readonly=True) as session:
            payloads = evidence_payloads(session, str(diagnosis.get("incident")), keys)
    except Exception:  # noqa: BLE001 -- printing falls back to the two-sided p, labelled
        payloads = {}
    for arm in arms:
        payload = payloads.get(str(arm.get("evidence")), {})
        if arm.get("p_less") is None and payload.get("p_less") is not None:
            arm["p_less"] = payload["p_less"]
    return {**diagnosis, "arms": arms}


def _p_text(arm: dict[str, Any]) -> str:
    """The one-sided p the arm's decision uses ("the arm fails less"); older diagnoses
    carry only the two-sided one, printed as such."""
    if arm.get("p_less") is not None:
        return f"  p={arm['p_less']:.2g}"
    if arm.get("p_value") is not None:
        return f"  p(two-sided)={arm['p_value']:.2g}"
    return ""


def observation_sentence(obs: dict[str, Any]) -> str:
    """One observation as a sentence for people, with the evidence id it was stored as."""
    name = str(obs.get("name"))
    facts = {k: v for k, v in obs.items() if k not in ("name", "prompt_tail", "evidence")}
    if name in _PRINTED_OBSERVATIONS or facts.get("error"):
        text = observation_summary(name, facts)
    else:
        parts = [f"{k.replace('_', ' ')} {_plain(v)}" for k, v in facts.items()]
        text = f"{name}: " + ("; ".join(parts) or "recorded")
    text = text[:1].upper() + text[1:]
    evidence = f" [{obs['evidence']}]" if obs.get("evidence") else ""
    return text.rstrip(".") + "." + evidence


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) or "none"
    return str(value)


def stack_line(server: dict[str, Any]) -> str:
    """The run's server in one line (recorded with secrets masked): model file and args,
    or the URL of a running server."""
    if server.get("model"):
        name = str(server["model"]).rsplit("/", 1)[-1]
        args = " ".join(str(a) for a in server.get("args") or [])
        return f"{name} {args}".strip()
    return f"running server at {server.get('url')}"


def format_diagnosis(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as text for a terminal."""
    lines = [f"Diagnosis of {diagnosis['incident']} (run {diagnosis.get('run_id')})", ""]
    server = (diagnosis.get("stack") or {}).get("server")
    if isinstance(server, dict) and (server.get("model") or server.get("url")):
        lines[1:1] = [f"stack: {stack_line(server)}"]
    note = (diagnosis.get("stack") or {}).get("host_workaround")
    if note:
        lines[1:1] = [f"note: {note} (drill servers only)"]
    reproduction = diagnosis.get("reproduction") or {}
    if reproduction and not reproduction.get("reproduced", True):
        lines += [f"NOT REPRODUCED: {reproduction.get('message')}", ""]
    verdict = diagnosis.get("verdict") or {}
    if verdict.get("status") == UNEXPLAINED:
        lines += [str(verdict.get("headline")), f"  {verdict.get('ruled_out')}", "  next:"]
        lines += [f"    - {probe}" for probe in verdict.get("next_probes") or []]
        lines.append("")
    failed = [f for f in diagnosis.get("findings", []) if not f.get("passed", True)]
    if failed:
        lines.append("Findings in the failing exchange:")
        lines += [f"  - {f['kind']}: {f['reason']}" for f in failed]
        lines.append("")
    lines += _arm_lines(diagnosis.get("arms", []))
    skipped = diagnosis.get("skipped_arms") or []
    if skipped:
        lines.append("Arms not run (they cannot matter here):")
        lines += [f"  {s['arm']:<24} {s['reason']}" for s in skipped]
        lines.append("")
    for status in ("confirmed", "rejected", "suspected"):
        group = [c for c in diagnosis.get("causes", []) if c["status"] == status]
        if not group:
            continue
        lines.append(f"{status.upper()}:")
        for cause in group:
            ev = ", ".join(cause.get("evidence") or []) or "-"
            lines.append(f"  {cause['id']}: {cause['rationale']} [evidence: {ev}]")
        lines.append("")
    observed = [
        o for o in diagnosis.get("observations", []) if o.get("name") in _PRINTED_OBSERVATIONS
    ]
    if observed:
        lines.append("Observations:")
        lines += [f"  - {observation_sentence(obs)}" for obs in observed]
        lines.append("")
    atlas = format_match_dicts(diagnosis.get("atlas_matches") or [])
    if atlas:
        lines += [*atlas, ""]
    cost = diagnosis.get("cost") or {}
    if cost:
        lines.append(
            f"cost: {cost.get('requests')} requests, {cost.get('wall_seconds')} s "
            f"wall, {cost.get('server_seconds')} s server, "
            f"{cost.get('launch_seconds')} s launches"
        )
    return "\n".join(lines).rstrip() + "\n"


def _arm_lines(arms: list[dict[str, Any]]) -> list[str]:
    lines = [
        "Probe arms (failures k/n, rate, 95% Wilson interval, one-sided p that the arm fails "
        "less than the baseline, decision, decode tok/s):"
    ]
    speeds = False
    for arm in arms:
        rate = "-" if arm["rate"] is None else f"{arm['rate']:.2f}"
        lo, hi = arm["ci95"]
        extra = ""
        if arm.get("speed_tok_s"):
            speeds = True
            extra += f"  {arm['speed_tok_s']:.0f} tok/s"
        if arm.get("draft_acceptance") is not None:
            extra += f"  draft acceptance {arm['draft_acceptance']:.0%}"
        if arm.get("error"):
            extra += f"  ERROR: {arm['error']}"
        elif not arm.get("n") and arm.get("decision") == "not-run":
            extra += f"  NOT RUN: {arm.get('stopped') or 'no replay'}"
        lines.append(
            f"  {arm['name']:<24} {arm['failures']:>3}/{arm['n']:<3} rate {rate}  "
            f"[{lo:.2f}, {hi:.2f}]{_p_text(arm)}  {arm['decision']}{extra}"
        )
    if speeds:
        lines.append("  " + TOK_S_NOTE)
    return [*lines, ""]


def _load_exchange(
    request: Path, response: Path | None, fmt: str, pick: int | None = None
) -> tuple[JsonObject, list[Any], JsonObject]:
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
                return body, [], {}
        raise click.ClickException(str(exc)) from None
    try:  # a capture of several exchanges: which one, and its conversation's turns
        intake = conversation_intake(exchanges, file=str(request), pick=pick)
    except CaptureError as exc:
        raise click.ClickException(str(exc)) from None
    for line in intake.notes:
        click.echo(line, err=True)
    exchange = intake.exchange
    findings = findings_json(exchange)
    if intake.finding is not None:
        findings.append({k: intake.finding.to_dict().get(k) for k in FINDING_KEYS})
    return exchange.request, findings, exchange.to_dict()


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
        diagnosis = _run_diagnosis(
            store, request_path, response_path, fmt, stack, incident, options, resume, pick
        )
    validate_diagnosis(diagnosis)
    if json_out is not None:
        text = json.dumps(diagnosis, indent=2, sort_keys=True, default=str) + "\n"
        if str(json_out) == "-":
            sys.stdout.write(text)
        else:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(text, "utf-8")
    if json_out is None or str(json_out) != "-":
        with open_store(ctx) as store:
            click.echo(format_diagnosis(with_one_sided_p(store, diagnosis)))
    _exit_for_state(diagnosis)


def _exit_for_state(diagnosis: dict[str, Any]) -> None:
    """A run that did not reproduce the failure or ended with errors exits non-zero (1); an
    UNEXPLAINED verdict (reproduced, nothing confirmed) exits EXIT_UNEXPLAINED (4)."""
    state = diagnosis.get("state", "done")
    if (diagnosis.get("verdict") or {}).get("status") == UNEXPLAINED:
        sys.exit(EXIT_UNEXPLAINED)
    if state == "not-reproduced":
        message = (diagnosis.get("reproduction") or {}).get("message", "")
        raise click.ClickException(f"{message}")
    if (diagnosis.get("verdict") or {}).get("status") == "not-reproduced":
        raise click.ClickException(str(diagnosis["verdict"].get("headline", "not reproduced")))
    if state == "partial":
        raise click.ClickException(
            "the run ended with errors (see the arms marked ERROR or NOT RUN); continue it with "
            f"`triage diagnose --resume --incident {diagnosis['incident']} --stack ...`"
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
) -> dict[str, Any]:
    try:
        if resume:
            # The caller's own run: same stack (and request, incident when given), never one
            # another process is still running; ambiguity is refused with a list.
            wanted = None
            if request_path is not None:
                wanted = _load_exchange(request_path, response_path, fmt, pick)[0]
            run = run_to_resume(store, stack, request=wanted, incident=incident)
            label = (run.plan or {}).get("stack_label") or "stack not recorded"
            with store.session(readonly=True) as session:
                slug = run_incident_slug(session, run)
            click.echo(f"resuming run {run.id} of {slug} (stack: {label})", err=True)
            diagnosis = resume_run(store, run, stack, options=options, progress=_progress_printer())
        else:
            if request_path is None:
                raise click.UsageError("--request is required (or --resume)")
            request, findings, exchange = _load_exchange(request_path, response_path, fmt, pick)
            _print_atlas_before(stack, exchange, findings)
            diagnosis = diagnose(
                store,
                stack,
                request,
                exchange=exchange,
                findings=findings,
                incident=incident,
                options=options,
                progress=_progress_printer(),
            )
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        raise click.ClickException(_interrupted_message(store)) from None
    # The atlas with the verdicts: an extra field beside them, never a change to them.
    exchange_data = None if resume else exchange
    matches, _, _ = diagnosis_matches(
        stack, exchange_data, diagnosis.get("findings", []), diagnosis
    )
    diagnosis["atlas_matches"] = [match.to_dict() for match in matches]
    return diagnosis


def _print_atlas_before(stack: Stack, exchange: JsonObject, findings: list[Any]) -> None:
    """Before probing: what the atlas says about the capture and the stack (on stderr, with
    the progress lines)."""
    matches, checked, warning = diagnosis_matches(stack, exchange, findings)
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
        diagnosis = latest_diagnosis(store, slug)
        exists, state, label = latest_run_state(store, slug, with_stack=True)
        printable = with_one_sided_p(store, diagnosis) if diagnosis is not None else None
    if not exists:
        raise click.ClickException(f"no incident {slug!r} (see `triage incidents list`)")
    if diagnosis is None:
        why = f"its latest run is {state}" if state else "no run recorded"
        if label:
            why += f" (stack: {label})"
        raise click.ClickException(
            f"no diagnosis recorded for {slug!r}: {why} (run `triage diagnose`"
            + (", or `triage diagnose --resume`" if state in ("interrupted", "partial") else "")
            + f", or see `triage incidents show {slug}`)"
        )
    if as_json:
        click.echo(json.dumps(diagnosis, indent=2, sort_keys=True, default=str))
    else:
        click.echo(format_diagnosis(printable or diagnosis))
    if diagnosis.get("state") == "not-reproduced":
        sys.exit(1)
    if (diagnosis.get("verdict") or {}).get("status") == "not-reproduced":
        sys.exit(1)
    if (diagnosis.get("verdict") or {}).get("status") == UNEXPLAINED:
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
