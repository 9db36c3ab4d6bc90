"""`triage ui`: the Streamlit web UI over the knowledge base and the engine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from sqlalchemy.exc import SQLAlchemyError

from kb.store import Store, StoreError, database_url, describe_db_error, redact_url

APP = Path(__file__).resolve().parent.parent / "ui" / "app.py"


def streamlit_argv(port: int, host: str) -> list[str]:
    """The `streamlit run` command line: headless, no telemetry, no file watcher."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--browser.gatherUsageStats=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
    ]


def start_ui(database: str | None, *, port: int = 8501, host: str = "127.0.0.1") -> None:
    """Migrate the knowledge base, then replace this process with the Streamlit server."""
    url = database_url(database)
    try:
        Store(url).close()  # apply migrations once, and fail here with a clear message
    except StoreError as exc:
        raise click.ClickException(f"{redact_url(url)}: {exc}") from None
    except SQLAlchemyError as exc:
        raise click.ClickException(f"{redact_url(url)}: {describe_db_error(exc)}") from None
    env = dict(os.environ, TRIAGE_DATABASE_URL=url)
    click.echo(f"triage ui on http://{host}:{port} (knowledge base {redact_url(url)})", err=True)
    argv = streamlit_argv(port, host)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: the server is this process, so stopping `triage ui` stops Streamlit too.
    os.execve(argv[0], argv, env)


@click.command("ui")
@click.option("--port", type=click.IntRange(1, 65535), default=8501, show_default=True,
              envvar="TRIAGE_UI_PORT", help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; the UI has no login).")
@click.pass_context
def ui_command(ctx: click.Context, port: int, host: str) -> None:
    """Start the web UI: incidents, diagnoses, cause graphs, decisions, retrospectives."""
    start_ui(ctx.obj.get("database") if ctx.obj else None, port=port, host=host)


def register(group: click.Group) -> None:
    group.add_command(ui_command)
