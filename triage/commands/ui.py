"""`triage ui`: the Streamlit web UI over the knowledge base and the engine."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from kb.service import KnowledgeBase, OpenError, StoreError, database_url, redact_url
from triage.ui.auth import (
    UiConfigError,
    UiSettings,
    config_path,
    default_secrets_files,
    is_loopback,
    load_config,
    oidc_configured,
    resolve_stacks,
    stack_entries,
)

APP = Path(__file__).resolve().parent.parent / "ui" / "app.py"
TEAM_HELP = "see README.md, 'Running the UI for a team'"


def streamlit_argv(port: int, host: str, secrets: Path | None = None) -> list[str]:
    """The `streamlit run` command line: headless, no telemetry, no file watcher."""
    argv = [
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
    if secrets is not None:
        argv.append(f"--secrets.files={secrets}")
    return argv


def resolve_settings(
    host: str,
    *,
    stacks: Sequence[str | Path] = (),
    config_file: Path | None = None,
    auth_header: str | None = None,
    trusted_proxies: Sequence[str] = (),
    secrets: Path | None = None,
) -> UiSettings:
    """The UI settings from the command line and ui.toml; refuses a non-loopback address
    without authentication (OIDC in Streamlit's secrets, or a trusted proxy header)."""
    config = load_config(config_file or config_path(), required=config_file is not None)
    header = (auth_header or config.auth_header).strip()
    if header and not all(c.isalnum() or c == "-" for c in header):
        raise UiConfigError(f"--auth-header {header!r}: not an HTTP header name")
    secrets_files = [secrets] if secrets is not None else default_secrets_files()
    if secrets is not None and not secrets.is_file():
        raise UiConfigError(f"--secrets {secrets}: no such file")
    if header:
        auth = "header"
    elif oidc_configured(secrets_files):
        if importlib.util.find_spec("authlib") is None:
            raise UiConfigError("OIDC login needs Authlib: pip install 'Authlib>=1.3.2'")
        auth = "oidc"
    else:
        auth = "none"
    if auth == "none" and not is_loopback(host):
        raise UiConfigError(
            f"refusing to serve the UI on {host} without authentication: anyone who reaches "
            "it could run triage on this machine. Configure OIDC login ([auth] in "
            ".streamlit/secrets.toml, or --secrets FILE) or run it behind an authenticating "
            f"reverse proxy with --auth-header X-Forwarded-User ({TEAM_HELP})"
        )
    proxies = tuple(trusted_proxies) or config.trusted_proxies
    settings = UiSettings(
        auth=auth,
        header=header,
        stacks=(*config.stacks, *stack_entries(stacks)),
    )
    if proxies:
        settings = UiSettings(settings.auth, settings.header, proxies, settings.stacks)
    for proxy in settings.trusted_proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise UiConfigError(f"trusted proxy {proxy!r}: not an IP address or network") from None
    return settings


def start_ui(
    database: str | None,
    *,
    port: int = 8501,
    host: str = "127.0.0.1",
    settings: UiSettings | None = None,
    stacks: Sequence[str | Path] = (),
    secrets: Path | None = None,
    read_only: bool = False,
) -> None:
    """Migrate the knowledge base, then replace this process with the Streamlit server.
    `read_only` (`triage --read-only ui`): open it read-only here and in the server."""
    try:
        if settings is None:
            settings = resolve_settings(host, stacks=stacks, secrets=secrets)
    except UiConfigError as exc:
        raise click.ClickException(str(exc)) from None
    url = database_url(database)
    try:
        # Apply migrations once (a read-only store checks the schema), and fail here with a
        # clear message.
        KnowledgeBase.open(url, readonly=True if read_only else None).close()
    except OpenError as exc:
        raise click.ClickException(str(exc)) from None
    except StoreError as exc:
        raise click.ClickException(f"{redact_url(url)}: {exc}") from None
    env = dict(os.environ, TRIAGE_DATABASE_URL=url, **settings.to_env())
    if read_only:
        env["TRIAGE_READ_ONLY"] = "1"
    login = {
        "none": "no login (loopback only)",
        "oidc": "OIDC login",
        "header": f"user from the {settings.header} header",
    }[settings.auth]
    click.echo(
        f"triage ui on http://{host}:{port} (knowledge base {redact_url(url)}; {login}; "
        f"{len(resolve_stacks(settings.stacks))} stack(s) for New triage)",
        err=True,
    )
    argv = streamlit_argv(port, host, secrets)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: the server is this process, so stopping `triage ui` stops Streamlit too.
    os.execve(argv[0], argv, env)


@click.command("ui")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8501,
    show_default=True,
    envvar="TRIAGE_UI_PORT",
    help="Port to listen on.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but loopback requires authentication "
    "(OIDC in Streamlit's secrets.toml, or --auth-header).",
)
@click.option(
    "--stack",
    "stacks",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A stack file the New-triage form may run (repeatable). Nobody can type "
    "a binary or arguments into the page.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="TRIAGE_UI_CONFIG",
    help="ui.toml: [ui] stacks, auth_header, trusted_proxies [default: $TRIAGE_HOME/ui.toml].",
)
@click.option(
    "--auth-header",
    help="Take the user from this header (e.g. X-Forwarded-User), "
    "set by an authenticating reverse proxy.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    help="Address or network of that proxy (repeatable) [default: loopback].",
)
@click.option(
    "--secrets",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Streamlit secrets.toml with an [auth] section for OIDC login "
    "[default: ~/.streamlit/ and ./.streamlit/].",
)
@click.pass_context
def ui_command(
    ctx: click.Context,
    port: int,
    host: str,
    stacks: tuple[Path, ...],
    config_file: Path | None,
    auth_header: str | None,
    trusted_proxies: tuple[str, ...],
    secrets: Path | None,
) -> None:
    """Start the web UI: incidents, diagnoses, cause graphs, decisions, retrospectives."""
    try:
        settings = resolve_settings(
            host,
            stacks=stacks,
            config_file=config_file,
            auth_header=auth_header,
            trusted_proxies=trusted_proxies,
            secrets=secrets,
        )
    except UiConfigError as exc:
        raise click.ClickException(str(exc)) from None
    start_ui(
        ctx.obj.get("database") if ctx.obj else None,
        port=port,
        host=host,
        settings=settings,
        secrets=secrets,
        read_only=bool(ctx.obj and ctx.obj.get("read_only")),
    )


def register(group: click.Group) -> None:
    group.add_command(ui_command)
