"""The `triage` command line: one click group; each area registers its commands.

The group loads a command's module only when that command runs (or its own --help is
asked for): `triage --help` and every command stay clear of the others' imports (the
proxy's uvicorn, the engine's scipy, the UI's Streamlit checks, SQLAlchemy for commands
that never open the knowledge base). The list of commands and the line each shows in
`triage --help` are kept here; tests/unit/test_cli_lazy.py checks them against the
modules' own `register(group)` and docstrings.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives and the first sentence of its help (what `triage --help` shows)."""

    module: str
    summary: str


# By name, as `triage --help` lists them. Each module exposes `register(group)`.
COMMANDS: dict[str, LazyCommand] = {
    "atlas": LazyCommand(
        "triage.commands.atlas",
        'Known public incidents: "this looks like llama.cpp#20824, fixed in build N".',
    ),
    "bisect": LazyCommand(
        "triage.commands.bisect",
        "Find the first published build that fails the request: noisy bisection, each build "
        "judged by the engine's sequential test (never one sample), resumable, every tested "
        "build recorded as evidence on the incident.",
    ),
    "capture": LazyCommand(
        "triage.commands.capture",
        "Store captured exchanges (redacted, with their findings) as evidence.",
    ),
    "check": LazyCommand(
        "triage.commands.capture",
        "Classify captured exchanges and print their findings (nothing is stored).",
    ),
    "decide": LazyCommand(
        "triage.commands.decisions",
        "Record a decision on an incident: --parked, --fixed or --reopened.",
    ),
    "demo": LazyCommand(
        "triage.commands.engine",
        "Diagnose the gemma4-thinking-budget drill (speculative draft + alternate weights).",
    ),
    "diagnose": LazyCommand(
        "triage.commands.engine",
        "Reproduce a failing exchange against its stack and decide which causes are real.",
    ),
    "drill": LazyCommand(
        "triage.commands.server",
        "Generate drill NAME, run it on a real llama-server, print what came back.",
    ),
    "export": LazyCommand(
        "triage.commands.kb",
        "Write stored incidents (all, or the SLUGS given) as incident files.",
    ),
    "family": LazyCommand(
        "triage.commands.search",
        "Past incidents with the same signature as an incident SLUG or a capture file.",
    ),
    "import": LazyCommand(
        "triage.commands.kb",
        "Import incident files (and every *.md in given directories).",
    ),
    "incidents": LazyCommand("triage.commands.kb", "Stored incidents."),
    "parked": LazyCommand(
        "triage.commands.decisions",
        "Parked incidents: revisit date, triggers, which are due or overdue and why.",
    ),
    "proxy": LazyCommand(
        "triage.commands.proxy",
        "Forward /v1/*, /props and /health to a llama-server, record every exchange, keep "
        "failure rates and open incidents when a failure signature appears or rises.",
    ),
    "retro": LazyCommand(
        "triage.commands.decisions",
        "The incident's retrospective, generated from its record; every claim cites its "
        "evidence once.",
    ),
    "revisit": LazyCommand(
        "triage.commands.decisions",
        "Rerun an incident's failing exchanges on the current stack; propose FIXED or keep it "
        "PARKED (with before/after failure rates), recording the run as evidence.",
    ),
    "search": LazyCommand(
        "triage.commands.search",
        "Full-text search over past incidents, best first, with the matching text.",
    ),
    "server": LazyCommand("triage.commands.server", "Build and locate the llama-server binary."),
    "show": LazyCommand("triage.commands.engine", "Print the latest diagnosis of an incident."),
    "ui": LazyCommand(
        "triage.commands.ui",
        "Start the web UI: incidents, diagnoses, cause graphs, decisions, retrospectives.",
    ),
}


def command_modules() -> list[str]:
    """Every module of triage/commands (the ones that register commands expose `register`)."""
    package = importlib.import_module("triage.commands")
    return sorted(
        info.name
        for info in pkgutil.iter_modules(package.__path__, "triage.commands.")
        if hasattr(importlib.import_module(info.name), "register")
    )


def load_commands(module: str) -> dict[str, click.Command]:
    """The commands `module` registers, by name. Every command module is part of the
    distribution: a missing one is a broken install, and its ImportError should say so."""
    group = click.Group()
    importlib.import_module(module).register(group)
    return dict(group.commands)


class LazyGroup(click.Group):
    """A group whose commands are imported when they are looked up, not when it is built."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        entry = COMMANDS.get(cmd_name)
        # A name the table does not know (a typo, or a command added to a module but not
        # yet to COMMANDS) loads every command module: slower, but never a missing command.
        modules = [entry.module] if entry is not None else command_modules()
        for module in modules:
            for name, command in load_commands(module).items():
                self.commands.setdefault(name, command)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS' summaries, cut as click cuts a command's help."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            command = self.commands.get(name) or click.Command(name, help=COMMANDS[name].summary)
            rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--database",
    envvar="TRIAGE_DATABASE_URL",
    default=None,
    help="SQLAlchemy URL of the knowledge base (default: SQLite file in the data directory).",
)
@click.option(
    "--read-only",
    "read_only",
    is_flag=True,
    envvar="TRIAGE_READ_ONLY",
    help="Open the knowledge base read-only: listing, showing and searching work, anything "
    "that writes is refused (automatic for a SQLite file this user cannot write).",
)
@click.pass_context
def cli(ctx: click.Context, database: str | None, read_only: bool) -> None:
    """Incident knowledge base and root-cause triage for llama-server."""
    ctx.ensure_object(dict)
    ctx.obj["database"] = database
    ctx.obj["read_only"] = True if read_only else None  # None: the store decides (see Store)


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
