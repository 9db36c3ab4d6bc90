"""`triage atlas`: the known-incident atlas -- list, show, match a capture or a server log,
import a team's own entries."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click

from kb.atlas import AtlasEntry, AtlasError, Facts, Match, import_atlas, match_atlas, team_dir
from kb.jsontypes import JsonObject
from triage.atlas.facts import facts_from_exchange, facts_from_log, facts_from_stack, merge_facts
from triage.atlas.report import atlas_entries, format_matches, read_log_file
from triage.capture import CaptureError
from triage.commands import echo_json
from triage.commands.capture import FormatChoice, collect
from triage.symptoms import classify


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)  # "Error: MESSAGE" on stderr, exit 1


def _entries(ctx: click.Context) -> tuple[AtlasEntry, ...]:
    try:
        return atlas_entries(ctx.obj.get("atlas_dirs", ()))
    except AtlasError as exc:
        _fail(str(exc))


@click.group("atlas")
@click.option(
    "--atlas",
    "extra",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    metavar="DIR",
    help="Also read the entries of this folder (repeatable; after the shipped entries, "
    "the team folder and $TRIAGE_ATLAS_PATH; a later entry replaces one of the same id).",
)
@click.pass_context
def atlas_group(ctx: click.Context, extra: tuple[Path, ...]) -> None:
    """Known public incidents: "this looks like llama.cpp#20824, fixed in build N".

    Entries ship with triage (kb/atlas/entries); a team adds its own with `triage atlas
    import DIR` (copied into $TRIAGE_HOME/atlas), $TRIAGE_ATLAS_PATH or --atlas DIR.
    A match is a pointer to a public report, never a verdict.
    """
    ctx.ensure_object(dict)
    ctx.obj["atlas_dirs"] = extra


@atlas_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """List the atlas entries (id, cause, builds, title)."""
    entries = _entries(ctx)
    if as_json:
        echo_json([_summary(entry) for entry in entries])
        return
    for entry in entries:
        click.echo(f"{entry.id:<28} {entry.cause:<24} {entry.builds.describe():<32} {entry.title}")
    click.echo(f"{len(entries)} entries")


def _summary(entry: AtlasEntry) -> JsonObject:
    """An entry as `atlas list --json` prints it."""
    return {
        "id": entry.id,
        "title": entry.title,
        "project": entry.project,
        "source": entry.source,
        "cause": entry.cause,
        "builds": entry.to_dict()["builds"],
        "file": entry.file,
    }


@atlas_group.command("show")
@click.argument("entry_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def show_command(ctx: click.Context, entry_id: str, as_json: bool) -> None:
    """Show one entry: source, signatures, builds, cause, fix and workaround."""
    entries = {entry.id: entry for entry in _entries(ctx)}
    entry = entries.get(entry_id)
    if entry is None:
        near = sorted(key for key in entries if entry_id.casefold() in key.casefold())[:5]
        hint = f" (did you mean {', '.join(near)}?)" if near else " (see `triage atlas list`)"
        _fail(f"no atlas entry {entry_id!r}{hint}")
    if as_json:
        echo_json(entry.to_dict())
        return
    data = entry.to_dict()
    click.echo(f"{entry.id}: {entry.title}")
    click.echo(f"  source:        {entry.source}")
    for url in entry.related:
        click.echo(f"  related:       {url}")
    click.echo(
        f"  project:       {entry.project}"
        + (f"  reported {entry.reported}" if entry.reported else "")
    )
    click.echo(
        f"  cause:         {entry.cause}" + (f" -- {entry.cause_text}" if entry.cause_text else "")
    )
    if entry.identified_by:
        click.echo(f"  identified by: {entry.identified_by}")
    click.echo(f"  builds:        {entry.builds.describe()}")
    for key, values in data["signatures"].items():
        if values:
            click.echo(f"  {key + ':':<14} {', '.join(map(str, values))}")
    for key in ("models", "backends", "cpu_flags", "server_flags", "clients"):
        if data[key]:
            click.echo(f"  {key + ':':<14} {', '.join(data[key])}")
    if entry.fix:
        click.echo(f"  fix:           {entry.fix}")
    if entry.workaround:
        click.echo(f"  workaround:    {entry.workaround}")
    if entry.body:
        click.echo("")
        click.echo(entry.body)
    click.echo(f"\n({entry.file})")


def _capture_facts(files: tuple[Path, ...], fmt: str, pick: int | None) -> list[tuple[str, Facts]]:
    try:
        exchanges = collect(files, fmt, None, None)
    except CaptureError as exc:
        _fail(str(exc))
    if pick is not None:
        if pick > len(exchanges):
            _fail(f"--exchange {pick}: the capture holds {len(exchanges)} exchange(s)")
        exchanges = [exchanges[pick - 1]]
    return [
        (f"{ex.source_file}#{ex.index}", facts_from_exchange(ex, classify(ex))) for ex in exchanges
    ]


def _facts_json(facts: Facts) -> JsonObject:
    """What was read from an input, as `atlas match --json` prints it."""
    return {
        "source": facts.source,
        "finding_kinds": sorted(facts.finding_kinds),
        "http_status": sorted(facts.http_status),
        "build": facts.build,
        "models": list(facts.models),
        "backends": sorted(facts.backends),
        "cpu_flags": sorted(f for f in facts.cpu_flags if f.startswith(("amx", "avx512", "avx2"))),
        "server_flags": sorted(facts.server_flags),
        "clients": sorted(facts.clients),
        "notes": list(facts.notes),
    }


@atlas_group.command("match")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A llama-server log (build, system_info, backtrace, errors, command line).",
)
@click.option(
    "--build",
    type=click.IntRange(min=1),
    default=None,
    help="The llama.cpp build the failing server ran (over a build the input states).",
)
@click.option(
    "--format",
    "fmt",
    type=FormatChoice(),
    default="auto",
    show_default=True,
    help="Capture format.",
)
@click.option(
    "--exchange", "pick", type=click.IntRange(min=1), metavar="N", help="Only the N-th exchange."
)
@click.option("--json", "as_json", is_flag=True, help="Print the matches as JSON.")
@click.pass_context
def match_command(
    ctx: click.Context,
    files: tuple[Path, ...],
    log_path: Path | None,
    build: int | None,
    fmt: str,
    pick: int | None,
    as_json: bool,
) -> None:
    """Match a capture (FILE...) and/or a server log (--log) against the atlas.

    Prints, for each exchange, the entries whose signatures it shares (best first, at most
    three), with the facts that matched and what to do; "no match" when none is strong
    enough -- a finding kind alone never matches.
    """
    if not files and log_path is None:
        raise click.UsageError("give a capture FILE or --log SERVER_LOG")
    entries = _entries(ctx)
    inputs: list[tuple[str, Facts]] = []
    log_facts: Facts | None = None
    if log_path is not None:
        try:
            text = read_log_file(log_path)
        except OSError as exc:
            _fail(f"{log_path}: cannot read the log: {getattr(exc, 'strerror', None) or exc}")
        log_facts = facts_from_log(text)
    if files:
        inputs = _capture_facts(files, fmt, pick)
        if log_facts is not None:  # the capture and the log of the same failure
            inputs = [(name, merge_facts(facts, log_facts)) for name, facts in inputs]
    elif log_facts is not None:
        inputs = [(str(log_path), log_facts)]
    if build is not None:
        stated = facts_from_stack(build=build, source="--build")
        inputs = [(name, merge_facts(stated, facts)) for name, facts in inputs]
    results = [(name, facts, match_atlas(facts, entries)) for name, facts in inputs]
    if as_json:
        echo_json(
            {
                "entries_checked": len(entries),
                "results": [
                    {
                        "input": name,
                        "facts": _facts_json(facts),
                        "matches": [m.to_dict() for m in matches],
                    }
                    for name, facts, matches in results
                ],
            }
        )
        return
    for name, facts, matches in results:
        click.echo(f"{name}: {'; '.join(facts.notes) or 'no build, model or crash facts'}")
        _echo_matches(matches, len(entries))


def _echo_matches(matches: list[Match], checked: int) -> None:
    for line in format_matches(matches, checked, indent="  "):
        click.echo(line)


@atlas_group.command("import")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
def import_command(folder: Path) -> None:
    """Check every entry file of FOLDER against the schema and copy them into the team's
    atlas folder ($TRIAGE_HOME/atlas); one bad file refuses the import."""
    try:
        result = import_atlas(folder, team_dir())
    except AtlasError as exc:
        _fail(str(exc))
    for label, ids in (
        ("added", result.added),
        ("updated", result.updated),
        ("unchanged", result.unchanged),
    ):
        if ids:
            click.echo(f"{label}: {', '.join(ids)}")
    if result.overrides_shipped:
        click.echo(
            f"these replace shipped entries of the same id: {', '.join(result.overrides_shipped)}"
        )
    click.echo(f"team atlas: {result.folder}")


def register(group: click.Group) -> None:
    """Add `atlas` to the CLI group."""
    group.add_command(atlas_group)
