"""`triage bisect`: which published llama.cpp build first fails the request."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from kb.jsontypes import JsonObject
from kb.service import KnowledgeBase, data_dir
from kb.service.bisect import BisectIncident, open_bisect_incident, record_bisect_evidence
from triage.bisect import (
    BisectError,
    BisectOptions,
    Bisector,
    BisectReport,
    BuildResult,
    CommitsBetween,
    ServerOracle,
    StateKey,
    commits_between,
    saved_meta,
    state_file,
    state_key,
    versions_between,
)
from triage.capture import CaptureError, load_file
from triage.commands import echo_json, open_kb, with_options
from triage.engine.servers import safe_args, safe_describe
from triage.llama.build import BuildError, parse_build_ref, published_versions, server_binary_for
from triage.stackfile import Stack, StackError, load_stack


def register(group: click.Group) -> None:
    group.add_command(bisect_command)


def _build(value: str, option: str) -> int:
    number = parse_build_ref(value)
    if number is None:
        raise click.BadParameter(f"{value!r} is not a build (e.g. b9585)", param_hint=option)
    return number


def _versions(value: str | None, good: int, bad: int) -> list[int]:
    try:
        if value:
            listed = [parse_build_ref(item) for item in value.split(",") if item.strip()]
            if None in listed:
                raise click.BadParameter(
                    f"{value!r}: a comma-separated list of builds", param_hint="--versions"
                )
            published = [number for number in listed if number is not None]
        else:
            published = published_versions()
        return versions_between(published, good, bad)
    except (BuildError, BisectError) as exc:
        raise click.ClickException(str(exc)) from None


MAX_REQUEST_BYTES = 10 * 1024 * 1024


def _load_request(path: Path, response: Path | None) -> JsonObject:
    """A JSON request body as it is, else any capture the capture layer reads."""
    if path.stat().st_size > MAX_REQUEST_BYTES:
        raise click.ClickException(f"{path}: larger than {MAX_REQUEST_BYTES} bytes")
    if response is None:
        try:
            body = json.loads(path.read_text("utf-8"))
        except (UnicodeDecodeError, ValueError):
            body = None
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            return body

    try:
        exchanges = load_file(path, response=response) if response else load_file(path)
    except CaptureError as exc:
        raise click.ClickException(str(exc)) from None
    if not exchanges:
        raise click.ClickException(f"{path}: no request found")
    return dict(exchanges[0].request)


def _load_stack(path: Path) -> Stack:
    try:
        stack = load_stack(path)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    if stack.server.model is None:
        raise click.ClickException(
            f"{path}: $.server.model: bisect launches each build and needs the model file"
        )
    return stack


def _run(bisector: Bisector, log: Callable[[str], None]) -> BisectReport:
    if bisector.results:
        log(
            f"resuming: {len(bisector.results)} builds measured before "
            f"({', '.join(f'b{n}' for n in sorted(bisector.results))})"
        )
    return bisector.run()


def format_report(report: BisectReport, commits: CommitsBetween | None, incident: str) -> str:
    """The bisection as text for a terminal."""
    lines = [
        f"Bisection b{report.good}..b{report.bad} ({report.builds_in_range} builds in "
        f"range; {len(report.tested)} tested, {report.requests} requests) -> "
        f"{report.outcome}",
        f"  {report.message}",
        "",
        "Tested builds (failures k/n, rate, 95% Wilson interval, p vs the bad build):",
    ]
    lines += [f"  {result.describe()}" for result in report.tested]
    for label, build in (("last good", report.last_good), ("first bad", report.first_bad)):
        result = report.result(build)
        if result is not None:
            lines.append(f"{label}: {result.describe()}")
    if commits:
        lines.append(f"llama.cpp commits between: {commits['commits']} ({commits['compare_url']})")
        for build_name, commit in commits.get("sdist_commit_ids", {}).items():
            lines.append(f"  {build_name} sdist packaging commit {commit}")
        if "changed_files" in commits:
            shown = commits["changed_files"][:15]
            lines.append(
                f"  {commits['changed_files_total']} files differ between the sdists: "
                + ", ".join(shown)
                + (" ..." if len(commits["changed_files"]) > 15 else "")
            )
    lines.append(f"evidence recorded on incident {incident}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Plan:
    """One bisection as the command resolved it."""

    good: int
    bad: int
    versions: list[int]
    request: JsonObject
    stack: Stack
    key: StateKey
    state_path: Path
    seed: int
    reference_n: int
    max_requests: int


def _log(line: str) -> None:
    click.echo(line, err=True)


def _bisect(kb: KnowledgeBase, incident: BisectIncident, plan: _Plan) -> BisectReport:
    """Run (or resume) the bisection, recording every tested build on the incident."""

    def record(result: BuildResult) -> None:
        _log(f"  {result.describe()}")
        record_bisect_evidence(
            kb,
            incident,
            f"bisect {result.describe()}",
            {"type": "bisect-build", "good": plan.good, "bad": plan.bad, **result.to_dict()},
        )

    oracle = ServerOracle(
        plan.stack,
        plan.request,
        seed=plan.seed,
        log_dir=data_dir() / "runs" / "bisect",
        binary_for=lambda number: server_binary_for(number, log=_log),
    )
    _log(
        f"bisecting {len(plan.versions)} builds b{plan.good}..b{plan.bad}; state {plan.state_path}"
    )
    try:
        bisector = Bisector(
            plan.versions,
            oracle,
            on_result=record,
            state_key=plan.key,
            meta={"incident": incident.slug},
            options=BisectOptions(
                reference_n=plan.reference_n, cap=plan.max_requests, state_path=plan.state_path
            ),
        )
        return _run(bisector, _log)
    except BisectError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        oracle.close()


def _record_outcome(
    kb: KnowledgeBase, incident: BisectIncident, plan: _Plan, report: BisectReport
) -> CommitsBetween | None:
    """Record the bisection's outcome (with the commits between the neighbours, if any)."""
    commits = None
    if report.last_good is not None and report.first_bad is not None:
        commits = commits_between(report.last_good, report.first_bad)
    record_bisect_evidence(
        kb,
        incident,
        f"bisect b{plan.good}..b{plan.bad}: {report.outcome}: {report.message}",
        {"type": "bisect-result", **report.to_dict(), "commits": commits},
        kind="observation",
    )
    return commits


_BISECT_OPTIONS = (
    click.option("--good", "good_ref", required=True, help="A build that works, e.g. b9585."),
    click.option("--bad", "bad_ref", required=True, help="A build that fails, e.g. b11434."),
    click.option(
        "--request",
        "request_path",
        required=True,
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        help="The failing request (JSON body or any capture format).",
    ),
    click.option(
        "--response",
        "response_path",
        default=None,
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        help="Its response, for capture formats that need one.",
    ),
    click.option(
        "--stack",
        "stack_path",
        required=True,
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        help="stack.toml: model and args of the failing server "
        "(its binary is replaced by each build).",
    ),
    click.option("--incident", default=None, help="Record on this incident (default: a new one)."),
    click.option(
        "--versions",
        "versions_list",
        default=None,
        help="Comma-separated builds to bisect over instead of the published list.",
    ),
    click.option(
        "--reference-n",
        type=click.IntRange(4, 1000),
        default=16,
        show_default=True,
        help="Replays of the bad build, whose failure rate the others are tested against.",
    ),
    click.option(
        "--max-requests",
        type=click.IntRange(4, 10000),
        default=64,
        show_default=True,
        help="Most replays of any other build (the sequential rule stops earlier).",
    ),
    click.option("--seed", type=int, default=1000, show_default=True, help="First seed."),
    click.option("--restart", is_flag=True, help="Forget the saved state of this bisection."),
    click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
)


@click.command("bisect")
@with_options(_BISECT_OPTIONS)
@click.pass_context
def bisect_command(
    ctx: click.Context,
    good_ref: str,
    bad_ref: str,
    request_path: Path,
    response_path: Path | None,
    stack_path: Path,
    incident: str | None,
    versions_list: str | None,
    reference_n: int,
    max_requests: int,
    seed: int,
    restart: bool,
    as_json: bool,
) -> None:
    """Find the first published build that fails the request: noisy bisection, each build
    judged by the engine's sequential test (never one sample), resumable, every tested build
    recorded as evidence on the incident."""
    good, bad = _build(good_ref, "--good"), _build(bad_ref, "--bad")
    versions = _versions(versions_list, good, bad)
    request = _load_request(request_path, response_path)
    stack = _load_stack(stack_path)
    key = state_key(good, bad, request, stack.server.key(), versions)
    state_path = state_file(data_dir() / "bisect", key)
    if restart:
        state_path.unlink(missing_ok=True)
    incident = incident or saved_meta(state_path).get("incident")
    plan = _Plan(
        good, bad, versions, request, stack, key, state_path, seed, reference_n, max_requests
    )
    with open_kb(ctx) as kb:
        recorded_on = open_bisect_incident(
            kb,
            incident,
            title=f"bisect b{good}..b{bad}: {request_path.name}",
            model=Path(str(stack.server.model)).stem,
            flags=safe_args(stack.server.args),
            stack={"server": safe_describe(stack.server)},
        )
        report = _bisect(kb, recorded_on, plan)
        commits = _record_outcome(kb, recorded_on, plan, report)
    slug = recorded_on.slug
    if as_json:
        echo_json(
            {"incident": slug, **report.to_dict(), "commits": commits, "state": str(state_path)}
        )
        return
    click.echo(format_report(report, commits, slug), nl=False)
