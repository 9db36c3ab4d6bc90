"""The `triage` group loads a command's module only when the command is used: its --help
must read exactly as a group holding every command would print it, the list of commands
must be the one the modules register, and `triage --help` must not load the heavy modules."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from triage.cli import COMMANDS, LazyGroup, cli, command_modules, load_commands

# What `triage --help` has no use for (the proxy's server, the engine's statistics, the
# knowledge base's ORM, the UI, the capture layer's HTTP client).
HEAVY = ("uvicorn", "scipy", "sqlalchemy", "sqlmodel", "streamlit", "httpx", "triage.commands")


def _eager_group() -> click.Group:
    """The group as it was before it was lazy: every module registered up front."""
    group = click.Group(
        "triage",
        params=list(cli.params),
        help=cli.help,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    for module in command_modules():
        for name, command in load_commands(module).items():
            group.add_command(command, name)
    return group


def test_the_table_lists_every_registered_command_with_its_module() -> None:
    registered = {name: module for module in command_modules() for name in load_commands(module)}
    assert registered == {name: entry.module for name, entry in COMMANDS.items()}


@pytest.mark.parametrize("width", [50, 80, 120, 400])
def test_triage_help_reads_as_the_eager_group_prints_it(width: int) -> None:
    runner = CliRunner()
    lazy = runner.invoke(cli, ["--help"], prog_name="triage", terminal_width=width)
    eager = runner.invoke(_eager_group(), ["--help"], prog_name="triage", terminal_width=width)
    assert lazy.exit_code == eager.exit_code == 0
    assert lazy.output == eager.output
    assert "\n  search     Full-text" in lazy.output


def test_a_fresh_group_lists_commands_without_loading_them() -> None:
    # A group of its own: the shared `cli` keeps the commands earlier tests loaded.
    group = LazyGroup("triage", params=list(cli.params), help=cli.help)
    result = CliRunner().invoke(group, ["--help"], prog_name="triage")
    assert result.exit_code == 0
    assert group.commands == {}
    assert all(f"\n  {name} " in result.output for name in COMMANDS)


def test_a_command_runs_and_an_unknown_one_is_refused() -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["atlas", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert any(entry["id"] for entry in json.loads(listed.output))
    unknown = runner.invoke(cli, ["serach", "x"])
    assert unknown.exit_code == 2
    assert "No such command 'serach'" in unknown.output


def test_a_command_missing_from_the_table_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # As when a command is added to a module but not to COMMANDS yet.
    table = {name: entry for name, entry in COMMANDS.items() if name != "search"}
    monkeypatch.setattr("triage.cli.COMMANDS", table)
    group = LazyGroup("triage", params=list(cli.params), help=cli.help)
    result = CliRunner().invoke(group, ["search", "--help"], prog_name="triage")
    assert result.exit_code == 0, result.output
    assert "Full-text search over past incidents" in result.output
    listed = CliRunner().invoke(group, ["--help"], prog_name="triage")
    assert "\n  search " in listed.output  # loaded now, so listed too


def test_triage_help_does_not_import_the_commands_heavy_modules() -> None:
    probe = (
        "import sys\n"
        "from triage.cli import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='triage')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert "Commands:" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"
