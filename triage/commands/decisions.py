"""`triage decide`, `triage parked`, `triage revisit`, `triage retro`: decisions on incidents,
the parked list, re-running parked incidents on the current stack, retrospectives.

The clock is `TRIAGE_TODAY` (YYYY-MM-DD) when set, so tests and drills can move it.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import click

from kb.domain.decisions import STATUS_AFTER, ParkedIncident
from kb.domain.triggers import DecisionError
from kb.jsontypes import JsonObject
from kb.service import TRIGGER_SYNTAX, DecisionRequest, RecordedDecision, describe_trigger
from triage.catalogue import catalogue
from triage.commands import echo_json, open_kb
from triage.engine import EngineError
from triage.revisit import RevisitResult, revisit_incident
from triage.stackfile import StackError

TODAY_ENV = "TRIAGE_TODAY"


# --------------------------------------------------------------------------- plumbing


def today() -> date:
    """The clock's date: `TRIAGE_TODAY` when set, else today in UTC."""
    value = os.environ.get(TODAY_ENV, "").strip()
    if value:
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise click.ClickException(
                f"{TODAY_ENV}={value!r} is not a date (YYYY-MM-DD)"
            ) from None
    return datetime.now(timezone.utc).date()


def now() -> datetime:
    """The clock's time: `TRIAGE_TODAY` at the current UTC time of day when set."""
    current = datetime.now(timezone.utc).replace(microsecond=0)
    return datetime.combine(today(), current.timetz())


def _default_actor() -> str:
    return os.environ.get("TRIAGE_USER") or os.environ.get("USER") or "cli"


def register(group: click.Group) -> None:
    group.add_command(decide_command)
    group.add_command(parked_command)
    group.add_command(revisit_command)
    group.add_command(retro_command)


# --------------------------------------------------------------------------- decide


_RELATIVE_UNITS = {"d": 1, "w": 7}
_MAX_RELATIVE_DAYS = 3660  # ten years: a revisit further out is a typo, not a plan


def _parse_date(_ctx: click.Context, _param: click.Parameter, value: str | None) -> date | None:
    """YYYY-MM-DD, or a date relative to today (UTC): `+90d`, `+12w`."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("+") and text[-1:].lower() in _RELATIVE_UNITS and text[1:-1].isdigit():
        days = int(text[1:-1]) * _RELATIVE_UNITS[text[-1].lower()]
        if 0 < days <= _MAX_RELATIVE_DAYS:
            return today() + timedelta(days=days)
        raise click.BadParameter(f"{value!r}: a relative date is +1d .. +{_MAX_RELATIVE_DAYS}d")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a date (YYYY-MM-DD, or relative to today: +90d, +12w)"
        ) from None


@click.command("decide")
@click.argument("slug")
@click.option("--parked", "kind", flag_value="PARKED", help="Park it: needs --why and a way back.")
@click.option("--fixed", "kind", flag_value="FIXED", help="Fixed: needs --fix and evidence.")
@click.option("--reopened", "kind", flag_value="REOPENED", help="A fixed failure came back.")
@click.option("--why", default="", help="The rationale.")
@click.option(
    "--revisit-on",
    callback=_parse_date,
    default=None,
    help="PARKED: revisit date (YYYY-MM-DD, or +90d / +12w from today).",
)
@click.option(
    "--when",
    "triggers",
    multiple=True,
    help=f"PARKED: revisit trigger, repeatable: {TRIGGER_SYNTAX}.",
)
@click.option("--fix", default="", help="FIXED: what was changed.")
@click.option("--tradeoff", default="", help="What the decision costs.")
@click.option(
    "--evidence",
    "evidence_keys",
    multiple=True,
    help="Evidence id the decision rests on (repeatable); for FIXED, the run that proves it.",
)
@click.option("--force", is_flag=True, help="FIXED: record an unverified fix, labelled as such.")
@click.option("--by", default=None, help="Who decides (default: $TRIAGE_USER or $USER).")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded decision as JSON.")
@click.pass_context
def decide_command(
    ctx: click.Context,
    slug: str,
    kind: str | None,
    why: str,
    revisit_on: date | None,
    triggers: tuple[str, ...],
    fix: str,
    tradeoff: str,
    evidence_keys: tuple[str, ...],
    force: bool,
    by: str | None,
    as_json: bool,
) -> None:
    """Record a decision on an incident: --parked, --fixed or --reopened.

    FIXED is refused unless a run on the current stack (see `triage revisit`) fails
    significantly less often than the incident's baseline; --force records the fix as
    unverified.
    """
    if kind is None:
        raise click.UsageError("say which decision: --parked, --fixed or --reopened")
    if force and kind != "FIXED":
        raise click.UsageError("--force only applies to --fixed")
    request = DecisionRequest(
        kind=kind,
        by=by if by is not None else _default_actor(),
        rationale=why,
        tradeoff=tradeoff,
        fix=fix,
        revisit_on=revisit_on,
        triggers=triggers,
        evidence_keys=evidence_keys,
        force=force,
        at=now(),
    )
    with open_kb(ctx) as kb:
        data = _decision_data(kb.record_decision(slug, request, catalogue().triggers))
    if as_json:
        echo_json(data)
        return
    click.echo(format_decision(slug, data))


def _decision_data(decision: RecordedDecision) -> JsonObject:
    """A recorded decision as the JSON `decide --json` prints."""
    return {
        "slug": decision.slug,
        "kind": decision.kind,
        "at": decision.at.isoformat(),
        "by": decision.by,
        "rationale": decision.rationale,
        "tradeoff": decision.tradeoff,
        "fix": decision.fix,
        "verified": decision.verified if decision.kind == "FIXED" else None,
        "revisit_on": decision.revisit_on.isoformat() if decision.revisit_on else None,
        "triggers": list(decision.triggers),
        "evidence": list(decision.evidence_keys),
    }


def format_decision(slug: str, data: JsonObject) -> str:
    """A recorded decision for people."""
    status = STATUS_AFTER[data["kind"]]
    lines = [f"recorded {data['kind']} for {slug} (status {status})"]
    if data["kind"] == "FIXED" and not data["verified"]:
        lines.append("  UNVERIFIED: recorded with --force, without the evidence a fix needs")
    lines.append(f"  rationale: {data['rationale']}")
    if data["revisit_on"]:
        lines.append(f"  revisit on: {data['revisit_on']}")
    for trigger in data["triggers"]:
        lines.append(f"  trigger: {describe_trigger(trigger, catalogue().triggers)}")
    if data["evidence"]:
        lines.append(f"  evidence: {', '.join(data['evidence'])}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- parked


def format_parked(items: list[ParkedIncident], day: date) -> str:
    """The parked list for people."""
    if not items:
        return f"no parked incidents are due as of {day}"
    lines = []
    for item in items:
        state = item.state.upper()
        if item.state == "overdue":
            state += f" ({item.days_overdue} day(s))"
        parked_on = f"parked {item.parked_on}" if item.parked_on else "no PARKED decision"
        by = f" by {item.decided_by}" if item.decided_by else ""
        lines.append(f"{item.slug}  {state}  {parked_on}{by}")
        lines.append(f"  {item.title}")
        if item.rationale:
            lines.append(f"  why parked: {item.rationale}")
        if item.tradeoff:
            lines.append(f"  tradeoff: {item.tradeoff}")
        for trigger in item.triggers:
            mark = "FIRED" if trigger.fired else "waiting"
            lines.append(f"  [{mark}] {trigger.description}: {trigger.reason}")
        if item.due:
            lines.append("  due because: " + "; ".join(item.reasons))
        if item.last_revisit:
            lines.append(f"  last revisit: {item.last_revisit}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


@click.command("parked")
@click.option("--due", "due_only", is_flag=True, help="Only those due or overdue.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def parked_command(ctx: click.Context, due_only: bool, as_json: bool) -> None:
    """Parked incidents: revisit date, triggers, which are due or overdue and why."""
    day = today()
    with open_kb(ctx) as kb:
        items = kb.parked(day, catalogue().triggers, due_only=due_only)
    if as_json:
        echo_json({"today": day.isoformat(), "parked": [item.to_dict() for item in items]})
        return
    click.echo(format_parked(items, day))


# --------------------------------------------------------------------------- revisit


@click.command("revisit")
@click.argument("slug", required=False)
@click.option(
    "--stack",
    "stack_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="stack.toml of the current stack (default: the one the incident's last run used).",
)
@click.option("--all-due", is_flag=True, help="Revisit every parked incident that is due.")
@click.option(
    "--max-requests",
    type=click.IntRange(1, 10000),
    default=32,
    show_default=True,
    help="Cap of replays per arm (the sequential rule stops earlier when decided).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def revisit_command(
    ctx: click.Context,
    slug: str | None,
    stack_path: Path | None,
    all_due: bool,
    max_requests: int,
    as_json: bool,
) -> None:
    """Rerun an incident's failing exchanges on the current stack; propose FIXED or keep it
    PARKED (with before/after failure rates), recording the run as evidence."""
    if bool(slug) == all_due:
        raise click.UsageError("give one SLUG or --all-due")
    # The replayer is the engine's unless the caller's context supplies one (tests do).
    replay_rate = (ctx.obj or {}).get("replay_rate")

    results: list[RevisitResult] = []
    failed = False
    with open_kb(ctx) as kb:
        if all_due:
            due = kb.parked(today(), catalogue().triggers, due_only=True)
            slugs = [item.slug for item in due]
        else:
            assert slug is not None
            slugs = [slug]
        for name in slugs:
            try:
                result = revisit_incident(
                    kb.store,
                    name,
                    stack_path,
                    max_requests=max_requests,
                    replay_rate=replay_rate,
                    at=now(),
                )
            except (DecisionError, StackError, EngineError) as exc:
                if not all_due:
                    raise click.ClickException(str(exc)) from None
                failed = True
                results.append(RevisitResult(name, "?", "none", f"error: {exc}", errored=True))
                continue
            failed = failed or result.errored
            results.append(result)
    if as_json:
        echo_json({"today": today().isoformat(), "revisits": [r.to_dict() for r in results]})
    else:
        if all_due and not results:
            click.echo(f"no parked incident is due as of {today()}")
        for result in results:
            click.echo(f"{result.slug}: {result.message}")
    if failed:
        ctx.exit(1)


# --------------------------------------------------------------------------- retro


@click.command("retro")
@click.argument("slug")
@click.option("--html", "as_html", is_flag=True, help="Render HTML instead of Markdown.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "plain", "slack"]),
    default="markdown",
    show_default=True,
    help="markdown: citations link to the evidence list (GitHub, the HTML page); plain: "
    "Markdown that pastes into Jira, GitHub issues and wikis (plain [E1] citations, no "
    "anchors, no needless escapes); slack: Slack's markup (*bold*, _italic_, no escapes).",
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write to this file instead of stdout.",
)
@click.pass_context
def retro_command(
    ctx: click.Context, slug: str, as_html: bool, fmt: str, out_file: Path | None
) -> None:
    """The incident's retrospective, generated from its record; every claim cites its
    evidence once. Markup in recorded text is inert in the HTML."""
    # Lazy: kb.domain.retro loads markdown-it (~0.2 s), which no other command needs.
    from kb.domain.retroformat import retro_html, retro_text

    if as_html and fmt != "markdown":
        raise click.UsageError("--html renders the markdown format; leave out --format")
    with open_kb(ctx) as kb:
        record = kb.require_record(slug)
    text = retro_html(record) if as_html else retro_text(record, fmt)
    if out_file is None:
        click.echo(text, nl=False)
        return
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(text, "utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {out_file}: {exc}") from None
    click.echo(f"wrote {out_file}")
