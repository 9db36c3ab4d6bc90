"""`triage decide`, `triage parked`, `triage revisit`, `triage retro`: decisions on incidents,
the parked list, re-running parked incidents on the current stack, retrospectives.

The clock is `TRIAGE_TODAY` (YYYY-MM-DD) when set, so tests and drills can move it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import click

from kb import decisions as kb_decisions
from kb.decisions import DecisionError
from kb.store import Store, add_evidence, require_incident
from triage.commands import echo_json, open_store

TODAY_ENV = "TRIAGE_TODAY"
REVISITABLE = ("parked", "fixed", "reopened", "open")


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


def _parse_date(_ctx: click.Context, _param: click.Parameter, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)") from None


@click.command("decide")
@click.argument("slug")
@click.option("--parked", "kind", flag_value="PARKED", help="Park it: needs --why and a way back.")
@click.option("--fixed", "kind", flag_value="FIXED", help="Fixed: needs --fix and evidence.")
@click.option("--reopened", "kind", flag_value="REOPENED", help="A fixed failure came back.")
@click.option("--why", default="", help="The rationale.")
@click.option(
    "--revisit-on", callback=_parse_date, default=None, help="PARKED: revisit date (YYYY-MM-DD)."
)
@click.option(
    "--when",
    "triggers",
    multiple=True,
    help=f"PARKED: revisit trigger, repeatable: {kb_decisions.TRIGGER_SYNTAX}.",
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
    with open_store(ctx) as store, store.session() as session:
        decision = kb_decisions.record_decision(
            session,
            slug,
            kind,
            rationale=why,
            tradeoff=tradeoff,
            fix=fix,
            by=by if by is not None else _default_actor(),
            revisit_on=revisit_on,
            triggers=triggers,
            evidence_keys=evidence_keys,
            force=force,
            at=now(),
        )
        data: dict[str, Any] = {
            "slug": slug,
            "kind": decision.kind,
            "at": decision.decided_at.isoformat(),
            "by": decision.decided_by,
            "rationale": decision.rationale,
            "tradeoff": decision.tradeoff,
            "fix": decision.fix,
            "verified": decision.verified if decision.kind == "FIXED" else None,
            "revisit_on": decision.revisit_on.isoformat() if decision.revisit_on else None,
            "triggers": decision.revisit_triggers,
            "evidence": decision.evidence_keys,
        }
    if as_json:
        echo_json(data)
        return
    status = kb_decisions.STATUS_AFTER[data["kind"]]
    click.echo(f"recorded {data['kind']} for {slug} (status {status})")
    if data["kind"] == "FIXED" and not data["verified"]:
        click.echo("  UNVERIFIED: recorded with --force, without the evidence a fix needs")
    click.echo(f"  rationale: {data['rationale']}")
    if data["revisit_on"]:
        click.echo(f"  revisit on: {data['revisit_on']}")
    for trigger in data["triggers"]:
        click.echo(f"  trigger: {kb_decisions.describe_trigger(trigger)}")
    if data["evidence"]:
        click.echo(f"  evidence: {', '.join(data['evidence'])}")


# --------------------------------------------------------------------------- parked


def format_parked(items: list[kb_decisions.ParkedIncident], day: date) -> str:
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
    with open_store(ctx) as store, store.session(readonly=True) as session:
        items = kb_decisions.parked(session, day, due_only=due_only)
    if as_json:
        echo_json({"today": day.isoformat(), "parked": [item.to_dict() for item in items]})
        return
    click.echo(format_parked(items, day))


# --------------------------------------------------------------------------- revisit


@dataclass
class RevisitResult:
    """What one revisit measured and what it proposes."""

    slug: str
    status: str
    proposal: str  # FIXED | PARKED | REOPENED | FIXED-holds | none
    message: str
    evidence: list[str] = field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] = field(default_factory=dict)
    probes: list[dict[str, Any]] = field(default_factory=list)
    errored: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "slug": self.slug,
            "status": self.status,
            "proposal": self.proposal,
            "message": self.message,
            "evidence": self.evidence,
            "before": self.before,
            "after": self.after,
            "probes": self.probes,
            "errored": self.errored,
        }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stack_facts(stack: Any) -> dict[str, Any]:
    """What the current stack is: its server, build number and weights hash (best effort:
    a missing fact is recorded as missing, the revisit still runs)."""
    facts: dict[str, Any] = {"source": str(stack.source), "server": stack.server.describe()}
    model = stack.server.model
    if model is not None and Path(model).is_file():
        facts["weights_sha256"] = _sha256(Path(model))
    if stack.server.url and model is None:
        return facts  # a running server: its build comes from the replies, if at all
    try:
        from triage.llama.build import binary_build_info, find_server_binary

        binary = stack.server.binary
        if binary is None or "/" not in str(binary):
            import shutil

            found = shutil.which(str(binary)) if binary is not None else None
            binary = Path(found) if found else find_server_binary()
        info = binary_build_info(binary)
        facts["build_number"] = info.get("build_number")
        facts["binary"] = str(binary)
    except Exception as exc:  # noqa: BLE001 - a fact we could not read, not a failure
        facts["build_error"] = str(exc)
    return facts


def _rate(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else f"{k}/{n}"


def _arm_payload(
    result: Any, arm: str, variant: str, baseline: tuple[int, int] | None
) -> dict[str, Any]:
    n, failures = int(result.n), int(result.failures)
    ci = getattr(result, "ci95", None)
    if ci is not None and not isinstance(ci, list):
        ci = list(ci.as_list()) if hasattr(ci, "as_list") else [ci[0], ci[1]]
    payload: dict[str, Any] = {
        "type": "arm",
        "arm": arm,
        "variant": variant,
        "level": "revisit",
        "n": n,
        "failures": failures,
        "rate": round(failures / n, 4) if n else None,
        "ci95": ci,
        "p_value": getattr(result, "p_value", None),
        "decision": str(getattr(result, "decision", "")),
    }
    for extra in ("error", "log_tail", "kinds", "speed_tok_s", "build_info", "stopped"):
        value = getattr(result, extra, None)
        if value not in (None, "", [], {}):
            payload[extra] = value
    if baseline is not None:
        payload["baseline"] = {"failures": baseline[0], "n": baseline[1]}
    return payload


def _summary_line(label: str, payload: dict[str, Any], base: kb_decisions.ArmCounts | None) -> str:
    text = f"{label}: {_rate(payload['failures'], payload['n'])} failed"
    ci = payload.get("ci95")
    if isinstance(ci, list) and len(ci) == 2:
        text += f", 95% CI {float(ci[0]):.2f}-{float(ci[1]):.2f}"
    if base is not None:
        text += f" vs baseline {_rate(base.failures, base.n)}"
    if payload.get("p_value") is not None:
        text += f", p={float(payload['p_value']):.2g}"
    return text + f"; {payload.get('decision') or 'no decision'}"


def revisit_incident(
    store: Store,
    slug: str,
    stack_path: Path | None,
    *,
    max_requests: int,
    log_dir: Path | None = None,
) -> RevisitResult:
    """Replay an incident's recorded failing exchanges (and, while the failure is still
    there, the deciding probes of its confirmed and suspected causes) on the current stack;
    record the results as evidence; propose FIXED, PARKED or REOPENED."""
    from triage.engine import replay_rate
    from triage.probes import request_arms
    from triage.stackfile import load_stack

    with store.session(readonly=True) as session:
        incident = require_incident(session, slug)
        if incident.status not in REVISITABLE:
            raise DecisionError(f"{slug} is {incident.status}: nothing to revisit")
        status = incident.status
        requests = kb_decisions.failing_requests(session, incident)
        baseline = kb_decisions.baseline_counts(session, incident)
        source = (
            str(stack_path) if stack_path else kb_decisions.recorded_stack_source(session, incident)
        )
        deciding = [
            (cause.key, cause.deciding_probe)
            for cause in kb_decisions.live_causes(session, incident)
            if cause.deciding_probe
        ]
    if not requests:
        raise DecisionError(
            f"{slug}: no recorded failing exchange to replay (evidence of kind 'exchange' "
            "with a request): run `triage diagnose` or `triage capture --incident "
            f"{slug}` first"
        )
    if not source:
        raise DecisionError(f"{slug}: no stack recorded for this incident; pass --stack STACK.toml")
    if not Path(source).is_file():
        raise DecisionError(f"{slug}: stack file {source} not found; pass --stack STACK.toml")
    stack = load_stack(source)
    facts = _stack_facts(stack)
    bodies = [body for _, body in requests]
    base_pair = (baseline.failures, baseline.n) if baseline else None
    run_dir = log_dir / slug if log_dir else None
    result = replay_rate(
        stack, bodies, max_requests=max_requests, baseline=base_pair, log_dir=run_dir
    )
    payload = _arm_payload(
        result,
        kb_decisions.REVISIT_ARM,
        "recorded failing exchanges replayed on the current stack",
        base_pair,
    )
    payload["stack"] = facts
    payload["requests"] = [key for key, _ in requests]
    if baseline is not None:
        payload["baseline"]["evidence"] = list(baseline.evidence_keys)
    build = facts.get("build_number")
    build_text = f" (build b{build})" if build else ""
    summary = _summary_line(f"revisit on the current stack{build_text}", payload, baseline)

    probe_payloads: list[tuple[str, dict[str, Any]]] = []
    if payload["failures"] and payload["decision"] not in ("errored", "removes"):
        # The failure is still there: do the deciding probes of the causes still (or now)
        # remove it on this stack? Request-level probes only; one run per probe.
        transforms = {arm.name: arm.transform for arm in request_arms(bodies[0])}
        by_probe: dict[str, list[str]] = {}
        for cause_key, probe in deciding:
            if probe in transforms and probe != "baseline":
                by_probe.setdefault(probe, []).append(cause_key)
        for probe, cause_keys in by_probe.items():
            probe_result = replay_rate(
                stack,
                [transforms[probe](body) for body in bodies],
                max_requests=max_requests,
                baseline=(payload["failures"], payload["n"]),
                log_dir=run_dir / probe if run_dir else None,
            )
            probe_payload = _arm_payload(
                probe_result,
                f"{kb_decisions.REVISIT_ARM}:{probe}",
                f"deciding probe of {', '.join(cause_keys)} on the current stack",
                (payload["failures"], payload["n"]),
            )
            probe_payload["causes"] = cause_keys
            probe_payloads.append((probe, probe_payload))

    at = now()
    keys: list[str] = []
    with store.session() as session:
        incident = require_incident(session, slug)
        assert incident.id is not None
        evidence = add_evidence(
            session,
            incident_id=incident.id,
            kind="measurement",
            summary=summary,
            payload=payload,
            source=f"triage revisit --stack {source}",
            recorded_at=at,
        )
        keys.append(evidence.key)
        for probe, probe_payload in probe_payloads:
            line = _summary_line(
                f"revisit probe {probe} on the current stack",
                probe_payload,
                kb_decisions.ArmCounts((evidence.key,), payload["failures"], payload["n"]),
            )
            keys.append(
                add_evidence(
                    session,
                    incident_id=incident.id,
                    kind="measurement",
                    summary=line,
                    payload=probe_payload,
                    source=f"triage revisit --stack {source}",
                    recorded_at=at,
                ).key
            )
    before = (
        {"failures": baseline.failures, "n": baseline.n, "evidence": list(baseline.evidence_keys)}
        if baseline
        else None
    )
    after = {k: payload[k] for k in ("failures", "n", "rate", "ci95", "p_value", "decision")}
    probes = [
        {"probe": name, **{k: p.get(k) for k in ("failures", "n", "decision")}}
        for name, p in probe_payloads
    ]
    decision = payload["decision"]
    rates = f"before {_rate(baseline.failures, baseline.n)}" if baseline else "no baseline"
    rates += f", after {_rate(payload['failures'], payload['n'])}"
    if payload.get("p_value") is not None:
        rates += f", p={float(payload['p_value']):.2g}"
    if decision == "errored":
        proposal = "none"
        message = f"revisit errored: {payload.get('error') or 'the server failed'} [{keys[0]}]"
    elif status == "fixed":
        if decision == "removes":
            proposal, message = "FIXED-holds", f"the fix holds ({rates}) [{keys[0]}]"
        elif payload["failures"]:
            proposal = "REOPENED"
            message = (
                f"the failure is back ({rates}) [{keys[0]}]; record it with: triage decide "
                f'{slug} --reopened --why "failure back on the current stack" '
                f"--evidence {keys[0]}"
            )
        else:
            proposal, message = "FIXED-holds", f"no failure replayed ({rates}) [{keys[0]}]"
    elif baseline is None:
        proposal = "PARKED" if status == "parked" else "none"
        message = (
            f"no baseline failure rate on record, so no fix can be shown ({rates}) "
            f"[{keys[0]}]; measure one with `triage diagnose`"
        )
    elif decision == "removes":
        proposal = "FIXED"
        message = (
            f"propose FIXED: the failure is gone on the current stack ({rates}) [{keys[0]}]; "
            f'record it with: triage decide {slug} --fixed --fix "WHAT CHANGED" '
            f"--evidence {keys[0]}"
        )
    else:
        proposal = "PARKED" if status == "parked" else "none"
        verdict = "unchanged" if decision == "unchanged" else f"not decided ({decision})"
        message = f"the failure is {verdict} on the current stack ({rates}) [{keys[0]}]"
        if status == "parked":
            message = "stays PARKED: " + message
    for probe, probe_payload in probe_payloads:
        message += (
            f"; deciding probe {probe}: {_rate(probe_payload['failures'], probe_payload['n'])}"
            f" ({probe_payload['decision']})"
        )
    if payload.get("error") and decision != "errored":
        # Some replies came back before the server failed; the rates above count only those.
        message += f"; the server failed part-way: {payload['error']}"
    return RevisitResult(
        slug=slug,
        status=status,
        proposal=proposal,
        message=message,
        evidence=keys,
        before=before,
        after=after,
        probes=probes,
        errored=decision == "errored",
    )


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
    try:
        from triage.engine import replay_rate  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"revisit needs triage.engine.replay_rate, which is not available: {exc}"
        ) from None
    from triage.engine import EngineError
    from triage.stackfile import StackError

    results: list[RevisitResult] = []
    failed = False
    with open_store(ctx) as store:
        if all_due:
            with store.session(readonly=True) as session:
                slugs = [item.slug for item in kb_decisions.parked(session, today(), due_only=True)]
        else:
            assert slug is not None
            slugs = [slug]
        for name in slugs:
            try:
                result = revisit_incident(store, name, stack_path, max_requests=max_requests)
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
    "--out",
    "out_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write to this file instead of stdout.",
)
@click.pass_context
def retro_command(ctx: click.Context, slug: str, as_html: bool, out_file: Path | None) -> None:
    """The incident's retrospective, generated from its record; every statement cites
    its evidence. Markup in recorded text is inert in the HTML."""
    from kb.files import load_record
    from kb.retro import retro_html, retro_markdown

    with open_store(ctx) as store, store.session(readonly=True) as session:
        record = load_record(session, slug)
    text = retro_html(record) if as_html else retro_markdown(record)
    if out_file is None:
        click.echo(text, nl=False)
        return
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(text, "utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {out_file}: {exc}") from None
    click.echo(f"wrote {out_file}")
