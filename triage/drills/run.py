"""Run a drill on a real llama-server and summarise what came back."""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import NotRequired, TypedDict

from kb.jsontypes import JsonObject
from triage.drills.registry import Drill
from triage.engine import classify_reply
from triage.llama.build import binary_build_info, find_server_binary
from triage.llama.client import ChatResult, LlamaClient, LlamaClientError
from triage.llama.launcher import ServerSpec, launch

TIMING_KEYS = (
    "prompt_n",
    "prompt_ms",
    "predicted_n",
    "predicted_ms",
    "draft_n",
    "draft_n_accepted",
)


class ToolCallSummary(TypedDict):
    """A tool call of a reply: the function's name and its arguments as sent."""

    name: str | None
    arguments: str | None


class ReplySummary(TypedDict):
    """The shape of one chat response of a drill run."""

    name: str
    status: int | None
    finish_reason: str | None
    content_chars: int
    reasoning_chars: int
    tool_calls: list[ToolCallSummary]
    timings: dict[str, float]
    elapsed_seconds: float
    error: NotRequired[str]
    draft_acceptance: NotRequired[float]


class SavedPair(TypedDict):
    """A failing reply saved for `triage diagnose`: its files and the command."""

    name: str
    kinds: list[str]
    request: str
    response: str
    diagnose: str


class ServerRun(TypedDict):
    """The server a drill ran on."""

    binary: str
    build: object
    model: str
    args: list[str]
    host_workaround: str | None
    launch_seconds: float | None
    log: str


class DrillRun(TypedDict):
    """What `triage drill` reports: the server, each reply's summary, the failing pairs."""

    drill: str
    server: ServerRun
    results: list[ReplySummary]
    out_dir: str
    failing: list[SavedPair]


def summarize(name: str, result: ChatResult) -> ReplySummary:
    """The shape of one chat response: finish, lengths, tool calls, timings."""
    timings = {key: result.timings[key] for key in TIMING_KEYS if key in result.timings}
    summary: ReplySummary = {
        "name": name,
        "status": result.status_code,
        "finish_reason": result.finish_reason,
        "content_chars": len(result.content),
        "reasoning_chars": len(result.reasoning_content),
        "tool_calls": [
            {
                "name": call.get("function", {}).get("name"),
                "arguments": call.get("function", {}).get("arguments"),
            }
            for call in result.tool_calls
        ],
        "timings": timings,
        "elapsed_seconds": round(result.elapsed, 4),
    }
    if result.error:
        summary["error"] = result.error
    if timings.get("draft_n"):
        summary["draft_acceptance"] = timings.get("draft_n_accepted", 0) / timings["draft_n"]
    return summary


def _slots(args: list[str]) -> int:
    for flag in ("-np", "--parallel"):
        if flag in args and args.index(flag) + 1 < len(args):
            return max(1, int(args[args.index(flag) + 1]))
    return 1


async def _send_all(
    base_url: str, bodies: list[tuple[str, JsonObject]], timeout: float, slots: int
) -> list[ChatResult]:
    # No more requests in flight than the server has slots: the client deadline then
    # measures serving time, not time spent queued behind other requests.
    gate = asyncio.Semaphore(slots)
    async with LlamaClient(base_url, timeout=timeout) as client:

        async def send(body: JsonObject) -> ChatResult:
            async with gate:
                return await client.chat(body)

        return list(await asyncio.gather(*(send(body) for _, body in bodies)))


def _file_stem(name: str) -> str:
    """`sampled#2` -> `sampled-2`: a request name as part of a file name."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)


def save_failing_pairs(
    out_dir: Path, bodies: list[tuple[str, JsonObject]], results: list[ChatResult]
) -> list[SavedPair]:
    """Write the request body sent and the raw response of every reply that fails (as
    `triage diagnose` classifies replies) as `failing-NAME.request.json` /
    `failing-NAME.response.json`; what was written, with the command that diagnoses it."""
    stack = out_dir / "stack.toml"
    saved: list[SavedPair] = []
    for (name, body), result in zip(bodies, results, strict=True):
        failed, kinds = classify_reply(body, result.status_code, result.json, result.elapsed)
        if not failed:
            continue
        request_path = out_dir / f"failing-{_file_stem(name)}.request.json"
        response_path = out_dir / f"failing-{_file_stem(name)}.response.json"
        request_path.write_text(json.dumps(body, indent=2) + "\n", "utf-8")
        response_path.write_bytes(result.raw)
        command = [
            "triage",
            "diagnose",
            "--request",
            str(request_path),
            "--response",
            str(response_path),
            "--stack",
            str(stack),
        ]
        saved.append(
            {
                "name": name,
                "kinds": kinds,
                "request": str(request_path),
                "response": str(response_path),
                "diagnose": shlex.join(command),
            }
        )
    return saved


def run_drill(
    drill: Drill,
    *,
    log_dir: Path,
    binary: Path | None = None,
    repeat: int = 1,
    contrasts: bool = True,
    timeout: float = 120.0,
) -> DrillRun:
    """Start the drill's incident server, send its scripted requests (unseeded ones `repeat`
    times with seeds 1..repeat) and its contrasts, save each failing request/response pair
    in the drill's folder, and return the summaries."""
    binary = binary or find_server_binary()
    bodies: list[tuple[str, JsonObject]] = []
    for described, body in zip(drill.manifest["requests"], drill.requests, strict=True):
        if repeat == 1 or "seed" in body:  # a fixed seed gives the same answer every time
            bodies.append((described["name"], body))
            continue
        for index in range(repeat):
            bodies.append((f"{described['name']}#{index + 1}", {**body, "seed": index + 1}))
    if contrasts:
        bodies.extend(drill.contrasts.items())
    spec = ServerSpec(binary, drill.model, list(drill.server_args))
    with launch(spec, log_dir) as server:
        try:
            results = asyncio.run(
                _send_all(server.base_url, bodies, timeout, _slots(drill.server_args))
            )
        except LlamaClientError as exc:
            explained = server.explain(exc)  # died or hung: say how, with its report
            if explained is None:
                raise
            why = explained.report.sentence() if explained.report else str(explained)
            raise LlamaClientError(
                f"{exc}; {why}", kind=exc.kind, url=exc.url, report=explained.report
            ) from explained
        launch_seconds = server.launch_seconds
        log_path = server.log_path
    return {
        "drill": drill.name,
        "server": {
            "binary": str(binary),
            "build": binary_build_info(binary).get("build_number"),
            "model": str(drill.model),
            "args": list(drill.server_args),
            "host_workaround": drill.host_note,
            "launch_seconds": launch_seconds,
            "log": str(log_path),
        },
        "results": [
            summarize(name, result) for (name, _), result in zip(bodies, results, strict=True)
        ],
        "out_dir": str(drill.out_dir),
        "failing": save_failing_pairs(drill.out_dir, bodies, results),
    }


def format_summary(summary: ReplySummary) -> str:
    """One line per response, for people."""
    timings = summary["timings"]
    parts = [
        f"{summary['name']:<22}",
        f"HTTP {summary['status']}",
        f"finish={summary['finish_reason']}",
        f"content={summary['content_chars']}ch",
        f"reasoning={summary['reasoning_chars']}ch",
        f"tool_calls={len(summary['tool_calls'])}",
    ]
    if "predicted_n" in timings:
        parts.append(f"tokens={timings['predicted_n']} in {timings.get('predicted_ms', 0):.0f}ms")
    if "draft_acceptance" in summary:
        parts.append(
            f"draft {timings.get('draft_n_accepted')}/{timings.get('draft_n')} "
            f"({summary['draft_acceptance']:.0%})"
        )
    if summary.get("error"):
        parts.append(f"error={summary['error']}")
    return "  ".join(parts)
