"""The server log as evidence (issue 24): each launched server's grammar lines, scanned while
it runs (triage.llama.grammar_log), tied to the replays in flight when each was written, and
noted at the end of a run as one observation per server (`server-log-grammar` for the
incident's). A server given by URL has no log the engine can read: its observation says
"not available". The hooks: the replayer wraps each replay's slot in `replay_window`, the
runner calls `note_server_logs` after `note_failures`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.engine.decide import Execution
from triage.engine.servers import Server, secret_values, server_label
from triage.llama.grammar_log import (
    FACT,
    GrammarLog,
    request_patterns,
    summary_fact,
    unavailable_fact,
)
from triage.llama.launcher import LOG_LIMIT_BYTES

__all__ = ["asks_for_grammar", "grammar_log", "note_server_logs", "replay_window"]


def grammar_log(server: Server) -> GrammarLog | None:
    """The server's log scan, started on first use; None for a server given by URL."""
    if server.grammar_log is None:
        path = getattr(server.handle, "log_path", None) if server.handle is not None else None
        if not isinstance(path, (str, Path)):
            return None
        server.grammar_log = GrammarLog(
            Path(path), secret_values(server.config.args), LOG_LIMIT_BYTES
        )
    return server.grammar_log


@asynccontextmanager
async def replay_window(
    server: Server,
    arm: str,
    index: int,
    body: JsonObject,
    slot: AbstractAsyncContextManager[None],
) -> AsyncIterator[None]:
    """Hold the replay's slot; while its request (`body`) is in flight, its window on the
    server's log."""
    async with slot:
        log = grammar_log(server)
        window = log.open_window(arm, index, request_patterns(body)) if log is not None else None
        try:
            yield
        finally:
            if log is not None:
                log.close_window(window)


def asks_for_grammar(request: JsonObject) -> bool:
    """Does the request ask for constrained output (a JSON schema or a grammar anywhere a
    client puts one)? Only then is an absent log worth saying."""
    response_format = request.get("response_format")
    return bool(
        request.get("json_schema")
        or request.get("grammar")
        or request.get("guided_json")
        or isinstance(request.get("format"), dict)
        or (isinstance(response_format, dict) and response_format.get("type") != "text")
    )


def note_server_logs(execution: Execution) -> None:
    """Each server's grammar lines as an observation: the incident's server always when the
    request asks for constrained output, any other server when its log holds such lines."""
    asks = asks_for_grammar(execution.plan.request)
    incident = execution.plan.stack.server
    for server in execution.servers.values():
        mine = server.config is incident
        arms = sorted(a.name for a in execution.arms.values() if a.group == server.key)
        name = FACT if mine else f"{'+'.join(arms) or server.key}-{FACT}"
        log = grammar_log(server)
        if log is None:
            if asks and mine:
                execution.facts[name] = dict(
                    unavailable_fact(
                        name, "a server given by URL: its log is not the engine's to read"
                    )
                )
            continue
        log.scan_all()
        summary = log.summary()
        if summary.texts or (asks and (mine or summary.arms)):
            label = "the incident's server" if mine else f"the server of {', '.join(arms)}"
            label += f" ({server_label(server.config)})"
            execution.facts[name] = dict(summary_fact(name, label, summary))
