"""`triage proxy`: the live recording proxy in front of a llama-server."""

from __future__ import annotations

import gc
import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

import click
import uvicorn

# Imported for its objects: they are among those _freeze_startup_objects puts out of reach.
import uvicorn.protocols.http.httptools_impl  # noqa: F401

from kb.service import data_dir
from triage.commands import with_options
from triage.proxy import (
    ProxyApp,
    ProxyConfig,
    ProxyMetrics,
    Recorder,
    RecorderProcess,
    RecorderProcessError,
    parse_listen,
)
from triage.proxy.diagnose import AutoDiagnose, AutoDiagnoseError, check_stack
from triage.proxy.grouping import OpeningRules
from triage.proxy.journal import JournaledRecorder
from triage.proxy.server import uvicorn_config

SWITCH_INTERVAL_SECONDS = 0.0005


class RecorderOptions(TypedDict):
    """What the command passes to the recorder, thread or process alike."""

    spool_path: Path
    sample_successes: float
    replica: str
    metrics: ProxyMetrics
    current_window: timedelta
    trailing_window: timedelta
    on_incident: AutoDiagnose | None
    opening: OpeningRules


# In the order `triage proxy --help` lists them.
_OPTIONS = (
    click.option(
        "--upstream",
        required=True,
        envvar="TRIAGE_PROXY_UPSTREAM",
        help="The llama-server to forward to, e.g. http://127.0.0.1:8080.",
    ),
    click.option(
        "--listen", default="127.0.0.1:8081", show_default=True, help="HOST:PORT to listen on."
    ),
    click.option(
        "--stack",
        "stack_path",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        default=None,
        help="stack.toml that --auto-diagnose replays against.",
    ),
    click.option(
        "--sample-successes",
        type=click.FloatRange(0.0, 1.0),
        default=1.0,
        show_default=True,
        help="Share of working exchanges whose bodies are stored (failures: all).",
    ),
    click.option(
        "--auto-diagnose",
        is_flag=True,
        help="Start `triage diagnose` against --stack for each incident opened.",
    ),
    click.option(
        "--diagnose-upstream",
        is_flag=True,
        help="Allow --auto-diagnose to replay against the production upstream.",
    ),
    click.option(
        "--spool",
        "spool_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Where exchanges wait while the database is down "
        "(default: DATA_DIR/proxy-spool.jsonl).",
    ),
    click.option(
        "--journal",
        "journal_path",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="Folder of the journal every answered exchange is written to before it is "
        "recorded, replayed after a crash (default: DATA_DIR/proxy-journal).",
    ),
    click.option(
        "--no-journal",
        is_flag=True,
        help="No journal: a killed proxy loses the exchanges it had not recorded yet.",
    ),
    click.option(
        "--window-minutes",
        type=click.IntRange(1, 24 * 60),
        default=10,
        show_default=True,
        help="Current window of the change detection.",
    ),
    click.option(
        "--trailing-minutes",
        type=click.IntRange(1, 7 * 24 * 60),
        default=60,
        show_default=True,
        help="Trailing window it is compared with.",
    ),
    click.option(
        "--upstream-timeout",
        type=click.FloatRange(0.1, 24 * 3600),
        default=600.0,
        show_default=True,
        help="Seconds allowed between two upstream bytes (then 504).",
    ),
    click.option(
        "--open-on-client-limits",
        is_flag=True,
        help="Also open incidents for failures the client configured (a reply that stopped "
        "at the request's own small max_tokens, a stop list that emptied the reply); "
        "by default they are recorded and shown on the Live page only.",
    ),
    click.option(
        "--min-exchanges",
        type=click.IntRange(1, 1_000_000),
        default=10,
        show_default=True,
        help="Exchanges of one model and request shape needed (current and trailing windows "
        "together) before an incident opens: the minimum comparison window.",
    ),
    click.option("--replica", default=None, help="Name of this replica (default: host-pid)."),
    click.option(
        "--recorder",
        "recorder_mode",
        type=click.Choice(["process", "thread"]),
        default="process",
        show_default=True,
        help="Where exchanges are classified and written: 'process' = a child process at "
        "idle CPU priority (SCHED_IDLE), off the forwarding path; 'thread' = a writer "
        "thread in the proxy process (shares its interpreter lock with the event loop).",
    ),
)


@click.command("proxy")
@with_options(_OPTIONS)
@click.pass_context
def proxy_command(
    ctx: click.Context,
    upstream: str,
    listen: str,
    stack_path: Path | None,
    sample_successes: float,
    auto_diagnose: bool,
    diagnose_upstream: bool,
    spool_path: Path | None,
    journal_path: Path | None,
    no_journal: bool,
    window_minutes: int,
    trailing_minutes: int,
    upstream_timeout: float,
    open_on_client_limits: bool,
    min_exchanges: int,
    replica: str | None,
    recorder_mode: str,
) -> None:
    """Forward /v1/*, /props and /health to a llama-server, record every exchange, keep
    failure rates and open incidents when a failure signature appears or rises."""
    try:
        host, port = parse_listen(listen)
        config = ProxyConfig(upstream=upstream, read_timeout=upstream_timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if replica:
        config.replica = replica
    database = (ctx.obj or {}).get("database")
    hook = None
    if auto_diagnose:
        hook = _auto_diagnose_hook(stack_path, config.upstream, diagnose_upstream, database)
    metrics = ProxyMetrics()
    options: RecorderOptions = {
        "spool_path": spool_path or data_dir() / "proxy-spool.jsonl",
        "sample_successes": sample_successes,
        "replica": config.replica,
        "metrics": metrics,
        "current_window": timedelta(minutes=window_minutes),
        "trailing_window": timedelta(minutes=trailing_minutes),
        "on_incident": hook,
        "opening": OpeningRules(
            open_on_client_limits=open_on_client_limits, min_exchanges=min_exchanges
        ),
    }
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    recorder: Any = _start_recorder(recorder_mode, database, options, hook)
    if not no_journal:
        recorder = JournaledRecorder(recorder, journal_path or data_dir() / "proxy-journal")
    app = ProxyApp(config, recorder=recorder, metrics=metrics)
    click.echo(f"triage proxy: http://{host}:{port} -> {config.upstream}", err=True)
    _serve(app, host, port, hook)


def _start_recorder(
    mode: str, database: str | None, options: RecorderOptions, hook: AutoDiagnose | None
) -> Recorder | RecorderProcess:
    """The recorder, started before the server (a recorder process that cannot start is
    one clear error, not a failed ASGI lifespan); ProxyApp's own start is then a no-op."""
    if mode == "thread":
        return Recorder(database, **options)
    recorder = RecorderProcess(database, **options)
    try:
        recorder.start()
    except RecorderProcessError as exc:
        if hook is not None:
            hook.stop()
        raise click.ClickException(str(exc)) from None
    return recorder


def _auto_diagnose_hook(
    stack_path: Path | None, upstream: str, diagnose_upstream: bool, database: str | None
) -> AutoDiagnose:
    """The --auto-diagnose hook, refused without --stack or against the upstream itself."""
    if stack_path is None:
        raise click.UsageError("--auto-diagnose needs --stack")
    try:
        check_stack(stack_path, upstream, allow_upstream=diagnose_upstream)
    except AutoDiagnoseError as exc:
        raise click.UsageError(str(exc)) from None
    return AutoDiagnose(stack_path, data_dir() / "proxy-diagnoses", database_url=database)


def _freeze_startup_objects() -> None:
    """Move everything loaded so far (the modules of uvicorn, aiohttp, SQLAlchemy, ...: about
    170,000 objects) out of the garbage collector's reach. A full collection scans every
    tracked object, about 65 ms here, and runs on the event loop whenever enough requests'
    objects have come and gone: measured as an event-loop lag p99 of 50-100 ms at 16 clients.
    Frozen objects are never freed, which is what modules and settings are anyway."""
    gc.collect()
    gc.freeze()


def _serve(app: ProxyApp, host: str, port: int, hook: AutoDiagnose | None) -> None:
    """Serve until Ctrl-C; the recorder and the auto-diagnose hook are stopped however the
    server ends."""
    # Other threads of this process share the interpreter lock with the event loop: the
    # writer itself with --recorder thread (classifying, compressing); with the recorder
    # process, the queue's feeder thread (pickling) and the thread applying the child's
    # metric updates. When one holds the lock, the loop waits for it up to the switch
    # interval (5 ms by default), a delay every forwarded chunk would feel (measured: event-
    # loop lag p99 up to 50 ms at 16 clients). 0.5 ms bounds that wait.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    _freeze_startup_objects()
    try:
        uvicorn.Server(uvicorn_config(app, host, port, log_level="info")).run()
    except KeyboardInterrupt:
        # uvicorn shut down gracefully (exchanges written or spooled) and then re-raised
        # the Ctrl-C: that is a normal stop, not an abort.
        pass
    finally:
        if app.recorder is not None:
            app.recorder.stop()  # a no-op after the lifespan shutdown; not when it failed
        if hook is not None:
            hook.stop()


def register(group: click.Group) -> None:
    group.add_command(proxy_command)
