"""`triage import`, `triage export`, `triage incidents list|new|show`: incident files and
records."""

from __future__ import annotations

from pathlib import Path

import click

from kb.domain.textguard import shorten
from kb.jsontypes import JsonObject
from kb.service import CAUSE_STATUSES, IMPORT_BATCH, INCIDENT_STATUSES, sidecar_paths
from triage.catalogue import catalogue
from triage.commands import echo_json, open_kb

# `incidents list` prints one line per incident: longer titles are cut (--json has them whole).
LIST_TITLE = 100


@click.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Validate and roll back: nothing is stored.")
@click.option(
    "--batch",
    type=click.IntRange(min=1, max=100_000),
    default=IMPORT_BATCH,
    show_default=True,
    metavar="N",
    help="Commit the incidents N at a time (each batch atomic; incidents linked by family "
    "share a batch; an import cut short keeps its whole batches and running it again stores "
    "the rest, never twice).",
)
@click.pass_context
def import_command(ctx: click.Context, paths: tuple[Path, ...], dry_run: bool, batch: int) -> None:
    """Import incident files (and every *.md in given directories).

    Every file is validated first; on any error nothing is stored and the message names
    the file and the field. The incidents are then committed --batch at a time (readers
    and other writers wait for one batch at most). An import cut short keeps its whole
    batches; running it again skips each incident already stored from the same file with
    the same content, and stores the rest.
    """

    def progress(done: int, total: int) -> None:
        if total > batch:
            click.echo(f"imported {done}/{total} incident(s) (batch committed)", err=True)

    with open_kb(ctx) as kb:
        result = kb.import_files(
            paths,
            dry_run=dry_run,
            batch=batch,
            progress=progress,
            causes=catalogue().causes.ids(),
        )
    verb = "would import" if dry_run else "imported"
    click.echo(f"{verb} {len(result.imported)} incident(s)")
    for slug in result.imported:
        click.echo(f"  {slug}")
    if result.skipped:
        click.echo(
            f"{len(result.skipped)} incident(s) already stored from the same file(s), "
            "not imported again"
        )
        for slug in result.skipped:
            click.echo(f"  {slug}")


@click.command("export")
@click.argument("slugs", nargs=-1)
@click.option(
    "--out",
    "out_dir",
    default="incidents",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write <slug>.md files into.",
)
@click.pass_context
def export_command(ctx: click.Context, slugs: tuple[str, ...], out_dir: Path) -> None:
    """Write stored incidents (all, or the SLUGS given) as incident files.

    One record that cannot be written does not stop the others: it is named with the
    field at fault, the rest are written, and the exit code is 1.
    """
    with open_kb(ctx) as kb:
        paths, errors = kb.export_incidents(out_dir, list(slugs) if slugs else None)
    click.echo(f"wrote {len(paths)} file(s)")
    for path in paths:
        click.echo(f"  {path}")
        for sidecar in sidecar_paths(path):
            if sidecar.is_file():
                click.echo(f"    + {sidecar.name} (replay evidence)")
    if errors:
        for error in errors:
            click.echo(f"Error: not exported: {error}", err=True)
        ctx.exit(1)


@click.group("incidents")
def incidents_group() -> None:
    """Stored incidents."""


@incidents_group.command("list")
@click.option(
    "--status", type=click.Choice(INCIDENT_STATUSES), help="Only incidents in this status."
)
@click.option("--cause", help="Only incidents with this cause (catalogue id or cause id).")
@click.option(
    "--cause-status",
    type=click.Choice(CAUSE_STATUSES),
    help="Only incidents with a cause in this status.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_command(
    ctx: click.Context,
    status: str | None,
    cause: str | None,
    cause_status: str | None,
    as_json: bool,
) -> None:
    """List incidents, oldest first."""
    with open_kb(ctx) as kb:
        rows = kb.summaries(status=status, cause=cause, cause_status=cause_status)
        orphans = 0 if as_json else kb.orphan_count()
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no incidents")
    for row in rows:
        decision = f" [{row['decision']}]" if row["decision"] else ""
        click.echo(f"{row['slug']}  {row['status']}{decision}  {shorten(row['title'], LIST_TITLE)}")
    if orphans:
        # On stderr: the listing itself stays one incident per line for scripts.
        click.echo(
            f"{orphans} captured exchange(s) attached to no incident: "
            "`triage capture --orphans` lists them, `--attach ID|all --incident SLUG` files them",
            err=True,
        )


def _cause_line(cause: JsonObject) -> str:
    """One cause of an incident record (its file's front matter) for people."""
    refines = "" if cause["catalogue"] == cause["id"] else f" (refines {cause['catalogue']})"
    return f"  {cause['status']:<9} {cause['id']}{refines} [{cause['basis']}]: {cause['title']}"


@incidents_group.command("new")
@click.argument("title")
@click.option("--model", default="", help="The model the incident is about.")
@click.option("--summary", default="", help="One paragraph: what happened.")
@click.option("--json", "as_json", is_flag=True, help="Print the new record as JSON.")
@click.pass_context
def new_command(ctx: click.Context, title: str, model: str, summary: str, as_json: bool) -> None:
    """Open an incident by hand (status open) and print its slug, for `triage capture
    --incident SLUG` and `triage diagnose --incident SLUG`."""
    with open_kb(ctx) as kb:
        slug = kb.open_incident(title, model=model, summary=summary)
        if as_json:
            echo_json(kb.require_record(slug))
            return
    click.echo(f"opened incident {slug}")


@incidents_group.command("show")
@click.argument("slug")
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
@click.pass_context
def show_command(ctx: click.Context, slug: str, as_json: bool) -> None:
    """Show one incident: stack, causes with status, decisions."""
    with open_kb(ctx) as kb:
        record = kb.require_record(slug)
    if as_json:
        echo_json(record)
        return
    click.echo(f"{record['slug']}: {record['title']}")
    closed = f", closed {record['closed']}" if record.get("closed") else ""
    click.echo(f"status {record['status']}, opened {record['opened']}{closed}")
    stack = record.get("stack", {})
    if stack:
        parts = [str(stack[k]) for k in ("model", "weights", "server_build") if k in stack]
        click.echo("stack: " + "; ".join(parts))
    if record.get("causes"):
        click.echo("causes:")
        for cause in record["causes"]:
            click.echo(_cause_line(cause))
    for decision in record.get("decisions", []):
        revisit = f", revisit on {decision['revisit_on']}" if decision.get("revisit_on") else ""
        click.echo(
            f"decision {decision['kind']} at {decision['at']}{revisit}: {decision['rationale']}"
        )
        if decision.get("fix"):
            verified = "verified" if decision["verified"] else "not verified"
            click.echo(f"  fix ({verified}): {decision['fix']}")
        if decision.get("tradeoff"):
            click.echo(f"  tradeoff: {decision['tradeoff']}")
    for link in record.get("family", []):
        click.echo(f"same family: {link['cause']} ~ {link['incident']} / {link['other_cause']}")


def register(group: click.Group) -> None:
    """Add the knowledge-base commands to the `triage` group."""
    group.add_command(import_command)
    group.add_command(export_command)
    group.add_command(incidents_group)
