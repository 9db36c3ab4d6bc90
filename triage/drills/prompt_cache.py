"""The `prompt-cache-timestamp` drill: a conversation whose system prompt begins with the time
of the turn, so llama-server's prompt cache reuses nothing and every turn re-evaluates the
whole conversation (issue 24's prompt-prefix incident).

The model is the schema-not-enforced chain (the official Qwen3.5 template; it thinks one
sentence, then writes "It is in Paris." and ends its turn), asked five turns in a row with a
~1,500-character house policy as the system prompt, preceded by "Current time: <ISO time>."
-- re-rendered every turn, as a client clock does. Nothing is wrong with any reply: the
failure is the latency, shown by the last turn's `timings` (cache_n ~0 of a prompt of
thousands of tokens: the unstable-prefix finding).

The capture is recorded on the real server (`record_capture`: the five turns, the last one
kept as a pair file); `prompt-cache-turns` then replays the conversation turn by turn, the
time re-rendered vs held. Exact, not a stand-in: the prompt cache's prefix reuse is
llama-server's own, whatever the model; the model only keeps each turn short.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kb.jsontypes import JsonObject
from triage.drills import reason
from triage.drills import schema as schema_drill
from triage.drills.drill import Drill, finish
from triage.engine.servers import open_server
from triage.llama.client import LlamaClient
from triage.stackfile import load_stack

NAME = "prompt-cache-timestamp"
TURNS = 5
POLICY = (
    "You are the help desk of a city guide. Answer in one short sentence. Be accurate, "
    "polite and brief. Never invent a fact; say so when you do not know. "
) * 10
QUESTIONS = (
    "Which city is the Eiffel Tower in?",
    "And the Louvre?",
    "Where is the Arc de Triomphe?",
    "Which city has the Pantheon on the left bank?",
    "Where is the Musee d'Orsay?",
)
ANSWER = "".join(schema_drill.PLAIN_PIECES)


def system_prompt(turn: int) -> str:
    """The system prompt as the client renders it at `turn`: the time first."""
    return f"Current time: 2026-12-01T17:{turn:02d}:07Z. {POLICY}"


def conversation(turn: int) -> JsonObject:
    """The client's request at `turn` (0-based): the system prompt of that turn, then every
    earlier question with the model's answer, then this turn's question."""
    messages: list[JsonObject] = [{"role": "system", "content": system_prompt(turn)}]
    for earlier in range(turn):
        messages += [
            {"role": "user", "content": QUESTIONS[earlier]},
            {"role": "assistant", "content": ANSWER},
        ]
    messages.append({"role": "user", "content": QUESTIONS[turn]})
    return {"messages": messages, "temperature": 0.0}


def _cause(expected: str, accept: list[str], why: str) -> JsonObject:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> JsonObject:
    """Expected verdicts: prompt-cache confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    quiet = "Every reply is right: the failure is the latency, no replay fails; nothing "
    causes = {
        cause: _cause("not-confirmed", not_confirmed, quiet + f"is attributed to {cause}.")
        for cause in (
            "reasoning-exhausts-budget",
            "speculative-decoding",
            "quantized-weights",
            "server-build",
            "output-parsing",
            "token-limit",
        )
    }
    causes["prompt-cache"] = _cause(
        "confirmed",
        ["confirmed"],
        "The time first in the system prompt changes every turn: replayed turn by turn the "
        "cache reuses nothing; with the time held it reuses the whole earlier prompt.",
    )
    causes["conversation-shape"] = _cause(
        "not-confirmed", not_confirmed, "The history renders and is answered."
    )
    return causes


def build(out_dir: Path, template: str) -> Drill:
    """Generate the prompt-cache-timestamp drill into `out_dir` (the Qwen3.5 template)."""
    spec = schema_drill.design()
    last = conversation(TURNS - 1)
    manifest: JsonObject = {
        "parameters": {
            "turns": TURNS,
            "system_prompt_chars": len(system_prompt(0)),
            "volatile": "an ISO time first in the system prompt, one minute on per turn",
            "answer": ANSWER,
        },
        "capture": "the last of five turns conversed on the real server, the time re-rendered "
        "every turn (triage.drills.prompt_cache.record_capture)",
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "last-turn",
                "role": "failing",
                "expect": {
                    "status": 200,
                    "content": ANSWER,
                    "finding": "unstable-prefix (timings.cache_n ~0)",
                    "failure_rate": 1.0,
                },
            }
        ],
    }
    return finish(
        NAME,
        spec,
        out_dir,
        reason.qwen35_template(),
        manifest,
        [last],
        {},
        template_source=f"llama.cpp/{reason.QWEN35_TEMPLATE.as_posix()}",
    )


# What a chat UI sends beside the conversation after its first turn (its own request, not a
# turn of the conversation): a session capture holds it between the turns.
TITLE_REQUEST: JsonObject = {
    "messages": [{"role": "user", "content": "Write a three-word title for a chat about Paris."}],
    "temperature": 0.0,
}


async def _converse(
    base_url: str, timeout: float, *, title: bool = False
) -> list[tuple[JsonObject, JsonObject, float]]:
    """The five turns (and, with `title`, the UI's title request after the first), each
    (request, reply, elapsed seconds), in the order sent."""
    client = LlamaClient(base_url, timeout=timeout)
    sent: list[tuple[JsonObject, JsonObject, float]] = []
    try:
        for turn in range(TURNS):
            requests = [conversation(turn)] + ([TITLE_REQUEST] if title and turn == 0 else [])
            for request in requests:
                result = await client.chat(request)
                if not result.ok or not isinstance(result.json, dict):
                    raise RuntimeError(f"{NAME}: turn {turn + 1} got HTTP {result.status_code}")
                sent.append((request, result.json, result.elapsed))
    finally:
        await client.aclose()
    return sent


def record_capture(drill: Drill, folder: Path, timeout: float = 120.0) -> Path:
    """Converse the drill's five turns on its real server (the time re-rendered every turn)
    and write the last turn as a pair capture, `folder/prompt-cache.json`. The server is
    stopped on return, also on failure."""
    stack = load_stack(drill.out_dir / "stack.toml")
    folder.mkdir(parents=True, exist_ok=True)
    with open_server(stack.server, folder / "record-logs", 60.0) as server:
        request, response, _ = asyncio.run(_converse(server.base_url, timeout))[-1]
    path = folder / "prompt-cache.json"
    record: dict[str, Any] = {"request": request, "response": response}
    path.write_text(json.dumps(record))
    return path


def _har_entry(request: JsonObject, reply: JsonObject, elapsed: float) -> JsonObject:
    def json_content(value: JsonObject) -> JsonObject:
        return {"mimeType": "application/json", "text": json.dumps(value)}

    header = [{"name": "content-type", "value": "application/json"}]
    return {
        "startedDateTime": "2026-12-01T17:00:07.000Z",
        "time": round(elapsed * 1000, 1),
        "request": {
            "method": "POST",
            "url": "http://127.0.0.1:8080/v1/chat/completions",
            "httpVersion": "HTTP/1.1",
            "headers": header,
            "postData": json_content(request),
        },
        "response": {"status": 200, "headers": header, "content": json_content(reply)},
    }


def record_session(drill: Drill, folder: Path, timeout: float = 120.0) -> Path:
    """Converse the drill's five turns on its real server, with a chat UI's title request
    after the first, and write the whole session as a HAR 1.2 capture,
    `folder/prompt-cache-session.har` (six entries; the last is the fifth turn). The server is
    stopped on return, also on failure."""
    stack = load_stack(drill.out_dir / "stack.toml")
    folder.mkdir(parents=True, exist_ok=True)
    with open_server(stack.server, folder / "record-logs", 60.0) as server:
        sent = asyncio.run(_converse(server.base_url, timeout, title=True))
    entries = [_har_entry(request, reply, elapsed) for request, reply, elapsed in sent]
    har = {"log": {"version": "1.2", "creator": {"name": "triage"}, "entries": entries}}
    path = folder / "prompt-cache-session.har"
    path.write_text(json.dumps(har))
    return path
