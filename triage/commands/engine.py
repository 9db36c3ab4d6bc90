"""`triage diagnose`, `triage show`, `triage demo`: the engine from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kb.store import Store
from triage.commands import open_store, with_options


def validate_diagnosis(diagnosis: dict[str, Any]) -> None:
    """Raise ValueError naming the JSON path if the diagnosis breaks its schema."""
    from kb.records import validate_diagnosis as validate

    validate(diagnosis)


def _progress_printer() -> Any:
    def show(event: Any) -> None:
        bar = ""
        if event.total:
            filled = int(20 * event.done / event.total)
            bar = "[" + "#" * filled + "." * (20 - filled) + f"] {event.done}/{event.total} "
        click.echo(f"  {event.stage:7} {bar}{event.message}", err=True)

    return show


def format_diagnosis(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as text for a terminal."""
    lines = [f"Diagnosis of {diagnosis['incident']} (run {diagnosis.get('run_id')})", ""]
    note = (diagnosis.get("stack") or {}).get("host_workaround")
    if note:
        lines[1:1] = [f"note: {note} (drill servers only)"]
    reproduction = diagnosis.get("reproduction") or {}
    if reproduction and not reproduction.get("reproduced", True):
        lines += [f"NOT REPRODUCED: {reproduction.get('message')}", ""]
    failed = [f for f in diagnosis.get("findings", []) if not f.get("passed", True)]
    if failed:
        lines.append("Findings in the failing exchange:")
        lines += [f"  - {f['kind']}: {f['reason']}" for f in failed]
        lines.append("")
    lines.append("Probe arms (failures k/n, rate, 95% Wilson interval, p vs baseline):")
    for arm in diagnosis.get("arms", []):
        rate = "-" if arm["rate"] is None else f"{arm['rate']:.2f}"
        p = "" if arm.get("p_value") is None else f"  p={arm['p_value']:.3g}"
        lo, hi = arm["ci95"]
        extra = ""
        if arm.get("speed_tok_s"):
            extra += f"  {arm['speed_tok_s']} tok/s"
        if arm.get("draft_acceptance") is not None:
            extra += f"  draft acceptance {arm['draft_acceptance']:.0%}"
        if arm.get("error"):
            extra += f"  ERROR: {arm['error']}"
        lines.append(
            f"  {arm['name']:<24} {arm['failures']:>3}/{arm['n']:<3} rate {rate}  "
            f"[{lo:.2f}, {hi:.2f}]{p}  {arm['decision']}{extra}"
        )
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
    for obs in diagnosis.get("observations", []):
        if obs.get("name") in (
            "spec-divergence",
            "weights-confounder",
            "template-render",
            "known-good-search",
        ):
            lines.append(
                f"observation {obs['name']}: "
                + json.dumps(
                    {k: v for k, v in obs.items() if k not in ("name", "prompt_tail")}, default=str
                )
            )
    cost = diagnosis.get("cost") or {}
    if cost:
        lines.append(
            f"cost: {cost.get('requests')} requests, {cost.get('wall_seconds')} s "
            f"wall, {cost.get('server_seconds')} s server, "
            f"{cost.get('launch_seconds')} s launches"
        )
    return "\n".join(lines).rstrip() + "\n"


def _load_exchange(
    request: Path, response: Path | None, fmt: str
) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
    from triage.capture import CaptureError, load_file, read_file
    from triage.symptoms import classify

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
    if not exchanges:
        raise click.ClickException(f"{request}: no exchange found")
    exchange = exchanges[0]
    findings = [_finding_dict(f) for f in classify(exchange)]
    return exchange.request, findings, exchange.to_dict()


def _request_only(data: Any) -> dict[str, Any] | None:
    """A bare chat request body (a JSON object), or None."""
    try:
        body = json.loads(data if isinstance(data, str) else bytes(data).decode("utf-8"))
    except (ValueError, TypeError):
        return None
    return body if isinstance(body, dict) and "response" not in body else None


def _finding_dict(finding: Any) -> dict[str, Any]:
    if isinstance(finding, dict):
        return finding
    data = finding.to_dict() if hasattr(finding, "to_dict") else dict(vars(finding))
    return {k: data.get(k) for k in ("kind", "passed", "score", "reason", "where")}


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
        "--json",
        "json_out",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Write the diagnosis JSON here ('-' for stdout).",
    ),
    click.option("--resume", is_flag=True, help="Continue the latest interrupted run."),
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
    json_out: Path | None,
    resume: bool,
) -> None:
    """Reproduce a failing exchange against its stack and decide which causes are real."""
    from triage.engine import DiagnoseOptions
    from triage.stackfile import StackError, load_stack

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
            store, request_path, response_path, fmt, stack, incident, options, resume
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
        click.echo(format_diagnosis(diagnosis))
    _exit_for_state(diagnosis)


def _exit_for_state(diagnosis: dict[str, Any]) -> None:
    """A run that did not reproduce the failure or ended with errors exits non-zero."""
    state = diagnosis.get("state", "done")
    if state == "not-reproduced":
        message = (diagnosis.get("reproduction") or {}).get("message", "")
        raise click.ClickException(f"{message}")
    if state == "partial":
        raise click.ClickException(
            "the run ended with errors (see the arms marked ERROR); continue it with "
            f"`triage diagnose --resume --incident {diagnosis['incident']} --stack ...`"
        )


def _run_diagnosis(
    store: Store,
    request_path: Path | None,
    response_path: Path | None,
    fmt: str,
    stack: Any,
    incident: str | None,
    options: Any,
    resume: bool,
) -> dict[str, Any]:
    from triage.engine import EngineError, diagnose, unfinished_run
    from triage.engine import resume as resume_run

    try:
        if resume:
            run = unfinished_run(store, incident)
            if run is None:
                raise click.ClickException(
                    "no interrupted run to resume" + (f" for {incident}" if incident else "")
                )
            click.echo(f"resuming run {run.id}", err=True)
            diagnosis = resume_run(store, run, stack, options=options, progress=_progress_printer())
        else:
            if request_path is None:
                raise click.UsageError("--request is required (or --resume)")
            request, findings, exchange = _load_exchange(request_path, response_path, fmt)
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
    return diagnosis


@click.command("show")
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON.")
@click.pass_context
def show_command(ctx: click.Context, slug: str, as_json: bool) -> None:
    """Print the latest diagnosis of an incident."""
    from triage.engine import latest_diagnosis, latest_run_state

    with open_store(ctx) as store:
        diagnosis = latest_diagnosis(store, slug)
        exists, state = latest_run_state(store, slug)
    if not exists:
        raise click.ClickException(f"no incident {slug!r} (see `triage incidents list`)")
    if diagnosis is None:
        why = f"its latest run is {state}" if state else "no run recorded"
        raise click.ClickException(
            f"no diagnosis recorded for {slug!r}: {why} (run `triage diagnose`"
            + (", or `triage diagnose --resume`" if state in ("interrupted", "partial") else "")
            + f", or see `triage incidents show {slug}`)"
        )
    if as_json:
        click.echo(json.dumps(diagnosis, indent=2, sort_keys=True, default=str))
    else:
        click.echo(format_diagnosis(diagnosis))
    if diagnosis.get("state") == "not-reproduced":
        sys.exit(1)


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
    from triage.demo import run_demo

    database = ctx.obj.get("database") if ctx.obj else None
    diagnosis = run_demo(
        database, work_dir, max_requests=max_requests, progress=_progress_printer()
    )
    click.echo(format_diagnosis(diagnosis))
    if ui:
        from triage.commands.ui import start_ui

        start_ui(database)
