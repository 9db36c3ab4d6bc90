"""Build a named drill into a folder: weight files, draft, manifest, requests, stack.toml."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from triage.drills import (
    client,
    flags,
    gateway,
    gemma4,
    kv_cache,
    model_file,
    real_drills,
    reason,
)
from triage.drills import context as context_drill
from triage.drills import embedding as embedding_drill
from triage.drills import prompt_cache as prompt_cache_drill
from triage.drills import rerank as rerank_drill
from triage.drills import schema as schema_drill
from triage.drills import stream_format as stream_drill
from triage.drills.drill import (
    DRAFT_THREAD_ARGS,
    GEMMA4_TEMPLATE_SOURCE,
    MANIFEST_VERSION,
    SERVER_ARGS,
    Drill,
    finish,
    manifest_head,
    request_body,
    spec_args,
    toml_value,
    weight_facts,
    write_stack,
)
from triage.drills.template import gemma4_template

# The shared drill pieces live in triage.drills.drill (below the builders, so no builder
# imports this registry); re-exported here, where callers have always found them.
__all__ = [
    "CAPTURE_RECORDERS",
    "DRAFT_THREAD_ARGS",
    "GEMMA4_TEMPLATE_SOURCE",
    "MANIFEST_VERSION",
    "SERVED",
    "SERVER_ARGS",
    "Drill",
    "build_drill",
    "finish",
    "list_drills",
    "manifest_head",
    "request_body",
    "spec_args",
    "toml_value",
    "weight_facts",
    "write_stack",
]


def _thinking_budget(out_dir: Path, template: str) -> Drill:
    spec = gemma4.thinking_budget_design()
    messages = [{"role": "user", "content": gemma4.HARBOUR_PROMPT}]
    greedy = request_body(messages, max_tokens=800, temperature=0.0, seed=42)
    sampled = request_body(messages, max_tokens=800, temperature=1.0)
    reasoning_chars = gemma4.expected_reasoning_chars(spec.design, 800)
    manifest = gemma4.thinking_budget_manifest(spec.facts, max_tokens=800)
    answer_chars = len(gemma4.HARBOUR_PARAGRAPH)
    manifest["requests"] = [
        {
            "name": "greedy",
            "role": "failing",
            "expect": {
                "finish_reason": "length",
                "content_chars": 0,
                "reasoning_chars": reasoning_chars,
                "failure_rate": 1.0,
            },
        },
        {
            "name": "sampled",
            "role": "failing",
            "expect": {
                "failure_rate": manifest["parameters"]["failure_rate"]["temperature_1"],
                "on_success": {"finish_reason": "stop", "content_chars": answer_chars},
            },
        },
    ]
    contrasts = {
        "greedy-thinking-off": {
            **greedy,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    }
    manifest["contrasts"] = [
        {
            "name": "greedy-thinking-off",
            "expect": {
                "finish_reason": "stop",
                "content_chars": answer_chars,
                "reasoning_chars": 0,
            },
        },
    ]
    return finish(
        "gemma4-thinking-budget", spec, out_dir, template, manifest, [greedy, sampled], contrasts
    )


def _toolcall(out_dir: Path, template: str) -> Drill:
    spec = gemma4.toolcall_design()
    messages = [{"role": "user", "content": gemma4.WEATHER_PROMPT}]
    sampled = request_body(messages, tools=[gemma4.WEATHER_TOOL], max_tokens=256, temperature=1.0)
    manifest = gemma4.toolcall_manifest(spec.facts)
    manifest["requests"] = [
        {
            "name": "sampled",
            "role": "failing",
            "expect": {
                "failure_rate": manifest["parameters"]["failure_rate"]["temperature_1"],
                "on_success": {
                    "finish_reason": "tool_calls",
                    "tool": "get_weather",
                    "arguments": {"location": "Paris"},
                },
                "on_failure": {
                    "finish_reason": "stop",
                    "content_chars": 0,
                    "tool_calls": 0,
                    "reasoning_contains": "<|tool_call>call:get_weather",
                },
            },
        },
    ]
    contrasts = {
        "greedy": {**sampled, "temperature": 0.0, "seed": 42},
        "sampled-thinking-off": {
            **sampled,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    }
    manifest["contrasts"] = [
        {"name": "greedy", "expect": {"finish_reason": "tool_calls", "failure_rate": 0.0}},
        {
            "name": "sampled-thinking-off",
            "expect": {"finish_reason": "tool_calls", "failure_rate": 0.0},
        },
    ]
    return finish("gemma4-toolcall", spec, out_dir, template, manifest, [sampled], contrasts)


_BUILDERS: dict[str, Callable[[Path, str], Drill]] = {
    "gemma4-thinking-budget": _thinking_budget,
    "gemma4-toolcall": _toolcall,
    "context-size": context_drill.build,
    "context-shift": context_drill.build_shift,
    **reason.BUILDERS,  # gemma4-reasoning-leak, qwen35-structured-output (issue 13)
    client.STREAM_DRILL: client.client_content_only,
    client.CONVERSATION_DRILL: client.conversation_python_args,
    model_file.NAME: model_file.build,
    kv_cache.NAME: kv_cache.build,
    gateway.NGINX: gateway.build_nginx,
    gateway.LITELLM: gateway.build_litellm,
    flags.NAME: flags.build,
    schema_drill.NAME: schema_drill.build,
    embedding_drill.NAME: embedding_drill.build,
    rerank_drill.NAME: rerank_drill.build,
    stream_drill.NAME: stream_drill.build,
    prompt_cache_drill.NAME: prompt_cache_drill.build,
}

# Drills that are served, not only built: a running llama-server behind a real gateway
# (triage.drills.gateway.serve starts both, yields the stack and the client's capture) or
# behind the stream-rewriting proxy (triage.drills.stream_format.serve, the same shape).
SERVED: dict[str, Callable[[Drill, Path], AbstractContextManager[Any]]] = {
    **{name: gateway.serve for name in gateway.KINDS},
    stream_drill.NAME: stream_drill.serve,
}

# Real-model drills (issue 23): real GGUF files from PyPI packages, measured ground truth.
_BUILDERS.update(real_drills.BUILDERS)


# Drills whose failure is in a capture, not only in a request (the client's view of a
# stream): name -> recorder(drill, folder) -> the capture file, recorded on the real server.
CAPTURE_RECORDERS: dict[str, Callable[[Drill, Path], Path]] = {
    client.STREAM_DRILL: client.record_capture,
    prompt_cache_drill.NAME: prompt_cache_drill.record_capture,
}


def list_drills() -> list[str]:
    """Names of the shared drills."""
    return sorted(_BUILDERS)


def build_drill(name: str, out_dir: Path) -> Drill:
    """Generate drill `name` into `out_dir` (a fraction of a second) and return it."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown drill {name!r}; known: {', '.join(list_drills())}") from None
    return builder(Path(out_dir), gemma4_template())
