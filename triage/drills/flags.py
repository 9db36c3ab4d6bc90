"""The launch-flags drill `server-flags-no-jinja`: the qwen35-structured-output model (the
official Qwen3.5 template, which llama-server also serves without Jinja as ChatML) on a
server started with `--no-jinja`, asked greedily with a tool. b11434 answers every such
request HTTP 500 "tools param requires --jinja flag" (measured); the same server with
`--jinja` (its default) answers. Exact, not a stand-in: the refusal is llama-server's own,
on any model. (With the Gemma 4 template a `--no-jinja` server does not even start: "this
custom template is not supported, try using --jinja", exit code 1 -- the engine refuses such
a stack naming that line.)
"""

from __future__ import annotations

from pathlib import Path

from triage.drills import gemma4, reason
from triage.drills.drill import Drill, ExpectedCause, finish, request_body

NAME = "server-flags-no-jinja"


def _cause(expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> dict[str, ExpectedCause]:
    """Expected verdicts: server-flags confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "server-flags": _cause(
            "confirmed",
            ["confirmed"],
            "--no-jinja with tools: every request is refused with HTTP 500; --jinja serves it.",
        ),
        "output-parsing": _cause(
            "not-confirmed", not_confirmed, "Nothing is generated: the request is refused."
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "Thinking off is refused the same way."
        ),
        "speculative-decoding": _cause(
            "not-confirmed", not_confirmed, "Without speculative decoding: still --no-jinja."
        ),
        "quantized-weights": _cause(
            "not-confirmed", not_confirmed, "The mxfp4 weights are served with --no-jinja too."
        ),
        "server-build": _cause("suspected", ["suspected"], "Not testable: one build."),
        "token-limit": _cause("not-confirmed", not_confirmed, "Nothing stops on length."),
    }


def build(out_dir: Path, template: str) -> Drill:
    """Generate the server-flags-no-jinja drill into `out_dir` (the Qwen3.5 template from the
    sdist, which llama-server also knows without Jinja as ChatML, so the server starts)."""

    spec = reason.structured_design()
    messages = [{"role": "user", "content": reason.CITY_PROMPT}]
    body = request_body(
        messages, tools=[gemma4.WEATHER_TOOL], max_tokens=256, temperature=0.0, seed=42
    )
    manifest = {
        "parameters": {"server_flag": "--no-jinja"},
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "greedy-tools",
                "role": "failing",
                "expect": {
                    "status": 500,
                    "error": "tools param requires --jinja flag",
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
        [body],
        {},
        extra_args=("--no-jinja",),
        template_source=f"llama.cpp/{reason.QWEN35_TEMPLATE.as_posix()}",
    )
