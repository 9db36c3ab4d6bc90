"""`make demo`: the gemma4-thinking-budget drill, end to end on a real llama-server.

Generates the drill (incident weights "qat", alternate weights "mxfp4", a speculative draft
model), captures a real failing exchange from the drill's server, imports the incident files
(so the knowledge base also holds the reference incident), and diagnoses the exchange.

On an AMX host the drill's servers run with --no-repack (triage.drills.host) and the demo says
so first. If a server crashes anyway, the demo ends with `DemoError`: the crash report's
sentence, the binary and the log, not a traceback.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from kb.jsontypes import JsonObject
from kb.repo.engine import data_dir
from kb.repo.files import import_paths
from kb.repo.store import Store, get_incident
from triage.capture import load_file
from triage.catalogue import catalogue
from triage.drills import build_drill
from triage.engine import (
    DiagnoseOptions,
    Diagnosis,
    ProgressEvent,
    ProgressFn,
    classify_reply,
    diagnose,
    open_server,
)
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.crash import CrashReport
from triage.stackfile import load_stack

DRILL = "gemma4-thinking-budget"
REPO_INCIDENTS = Path(__file__).resolve().parent.parent / "incidents"


async def _first_failure(
    base_url: str, request: JsonObject, seeds: range
) -> tuple[JsonObject, bytes] | None:
    async with LlamaClient(base_url, timeout=120) as client:
        for seed in seeds:
            body = {**request, "seed": seed}
            result = await client.chat(body)
            failed, _ = classify_reply(body, result.status_code, result.json, result.elapsed)
            if failed:
                return body, result.raw
    return None


def capture_failing_exchange(
    stack_path: Path, request: JsonObject, out_dir: Path
) -> tuple[Path, Path]:
    """Send the drill's request until a reply fails; save the real request/response pair."""
    stack = load_stack(stack_path)
    with open_server(stack.server, out_dir / "logs", 60.0) as server:
        try:
            found = asyncio.run(_first_failure(server.base_url, request, range(1, 200)))
        except LlamaClientError as exc:
            # A dead or hung server is the story, not the dropped connection.
            explained = server.handle.explain(exc) if server.handle is not None else None
            if explained is not None:
                raise explained from exc
            raise
    if found is None:
        raise RuntimeError("the drill did not fail in 199 seeds; its design has changed")
    body, raw = found
    request_path = out_dir / "failing-request.json"
    response_path = out_dir / "failing-response.json"
    request_path.write_text(json.dumps(body, indent=2) + "\n", "utf-8")
    response_path.write_bytes(raw)
    return request_path, response_path


class DemoError(click.ClickException):
    """The demo cannot go on (its llama-server crashed or hung); the CLI prints the message
    and exits 1, without a traceback."""


def crash_report_of(error: BaseException) -> CrashReport | None:
    """The CrashReport carried by `error` or by the errors it was raised from."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        report = getattr(current, "report", None)
        if isinstance(report, CrashReport):
            return report
        current = current.__cause__ or current.__context__
    return None


def crash_message(report: CrashReport, stack_path: Path) -> str:
    """What the user reads when the demo's server crashed or hung."""
    lines = [f"the demo's llama-server failed: {report.sentence()}", f"  drill stack: {stack_path}"]
    if report.log_path:
        lines.append(f"  server log:  {report.log_path}")
    if report.log_tail:
        lines.append("  last log lines:")
        lines += [f"    {line}" for line in report.log_tail[-10:]]
    if report.amx_suspected and not report.host_amx:
        lines.append(
            "  This host's CPU flags show no AMX, so the drill ran without --no-repack; "
            "if the server runs on an AMX CPU, set TRIAGE_CPU_FLAGS=amx_int8 to add it."
        )
    return "\n".join(lines)


def _say(progress: ProgressFn | None, message: str) -> None:
    if progress is not None:
        progress(ProgressEvent("host", message))


def run_demo(
    database: str | None,
    work_dir: Path | None,
    *,
    max_requests: int = 32,
    progress: ProgressFn | None = None,
) -> Diagnosis:
    """Build the drill, capture a failing exchange, diagnose it; DemoError if a server dies."""
    work = work_dir or data_dir() / "demo"
    drill = build_drill(DRILL, work / "drill")
    stack_path = drill.out_dir / "stack.toml"
    if drill.host_note:
        _say(
            progress,
            f"{drill.host_note}: the drill's servers run with --no-repack (see {stack_path})",
        )
    try:
        return _run(drill, stack_path, database, work, max_requests, progress)
    except Exception as exc:
        report = crash_report_of(exc)
        if report is None:
            raise
        raise DemoError(crash_message(report, stack_path)) from exc


def _run(
    drill: Any,
    stack_path: Path,
    database: str | None,
    work: Path,
    max_requests: int,
    progress: ProgressFn | None,
) -> Diagnosis:
    request_path, response_path = capture_failing_exchange(
        stack_path, drill.request("sampled"), work
    )
    exchange = load_file(request_path, response=response_path)[0]
    store = Store(database)
    try:
        if REPO_INCIDENTS.is_dir():
            with store.session(readonly=True) as session:
                have = get_incident(session, "2026-06-10-gemma4-empty-response") is not None
            if not have:
                import_paths(store, [REPO_INCIDENTS], causes=catalogue().causes.ids())
        return diagnose(
            store,
            exchange,
            load_stack(stack_path),
            options=DiagnoseOptions(max_requests=max_requests, log_dir=work / "runs"),
            progress=progress,
        )
    finally:
        store.close()
