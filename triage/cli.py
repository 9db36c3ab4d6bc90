"""The `triage` command line: one click group; each area registers its commands."""

from __future__ import annotations

import importlib

import click

# Each module in triage/commands/ exposes `register(group)`; the list keeps the order of --help.
COMMAND_MODULES = [
    "triage.commands.kb",
    "triage.commands.server",
    "triage.commands.capture",
    "triage.commands.engine",
    "triage.commands.decisions",
    "triage.commands.search",
    "triage.commands.ui",
    "triage.commands.bisect",
    "triage.commands.proxy",
    "triage.commands.atlas",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


def _register_all() -> None:
    # Every command module is part of the distribution: a missing one is a broken install,
    # and its ImportError should say so.
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(cli)


_register_all()


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
