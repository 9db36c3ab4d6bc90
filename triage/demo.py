"""`make demo`: the gemma4-thinking-budget drill, end to end on a real llama-server.

Generates the drill (incident weights "qat", alternate weights "mxfp4", a speculative draft
model), captures a real failing exchange from the drill's server, imports the incident files
(so the knowledge base also holds the reference incident), and diagnoses the exchange.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kb.store import Store, data_dir
from triage.engine import DiagnoseOptions, ProgressFn, diagnose, open_server
from triage.stackfile import load_stack

DRILL = "gemma4-thinking-budget"
REPO_INCIDENTS = Path(__file__).resolve().parent.parent / "incidents"


async def _first_failure(base_url: str, request: dict[str, Any], seeds: range
                         ) -> tuple[dict[str, Any], bytes] | None:
    from triage.engine import classify_reply
    from triage.llama.client import LlamaClient

    async with LlamaClient(base_url, timeout=120) as client:
        for seed in seeds:
            body = {**request, "seed": seed}
            result = await client.chat(body)
            failed, _ = classify_reply(body, result.status_code, result.json, result.elapsed)
            if failed:
                return body, result.raw
    return None


def capture_failing_exchange(stack_path: Path, request: dict[str, Any], out_dir: Path
                             ) -> tuple[Path, Path]:
    """Send the drill's request until a reply fails; save the real request/response pair."""
    stack = load_stack(stack_path)
    with open_server(stack.server, out_dir / "logs", 60.0) as server:
        found = asyncio.run(_first_failure(server.base_url, request, range(1, 200)))
    if found is None:
        raise RuntimeError("the drill did not fail in 199 seeds; its design has changed")
    body, raw = found
    request_path = out_dir / "failing-request.json"
    response_path = out_dir / "failing-response.json"
    request_path.write_text(json.dumps(body, indent=2) + "\n", "utf-8")
    response_path.write_bytes(raw)
    return request_path, response_path


def run_demo(database: str | None, work_dir: Path | None, *, max_requests: int = 32,
             progress: ProgressFn | None = None) -> dict[str, Any]:
    from triage.capture import load_file
    from triage.drills import build_drill
    from triage.symptoms import classify

    work = work_dir or data_dir() / "demo"
    drill = build_drill(DRILL, work / "drill")
    stack_path = drill.out_dir / "stack.toml"
    request_path, response_path = capture_failing_exchange(
        stack_path, drill.request("sampled"), work)
    exchange = load_file(request_path, response=response_path)[0]
    findings = [f.to_dict() if hasattr(f, "to_dict") else dict(vars(f))
                for f in classify(exchange)]
    store = Store(database)
    try:
        if REPO_INCIDENTS.is_dir():
            from kb.files import import_paths
            from kb.store import get_incident

            with store.session(readonly=True) as session:
                have = get_incident(session, "2026-06-10-gemma4-empty-response") is not None
            if not have:
                import_paths(store, [REPO_INCIDENTS])
        return diagnose(store, load_stack(stack_path), exchange.request,
                        exchange=exchange.to_dict(), findings=findings,
                        options=DiagnoseOptions(max_requests=max_requests, log_dir=work / "runs"),
                        progress=progress)
    finally:
        store.close()
