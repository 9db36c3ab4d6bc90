"""Failing and working exchanges as the proxy's forwarder hands them to the recorder, for
the tests of live grouping, client limits, live retrospectives and live exports."""

from __future__ import annotations

import json
from typing import Any

from proxy_fakes import raw_record

THOUGHT = "Let me think about this carefully, step by step, weighing every option. " * 20


def _record(
    key: str,
    at: float,
    *,
    request: dict[str, Any],
    message: dict[str, Any],
    finish: str,
    completion_tokens: int = 3,
) -> dict[str, Any]:
    record = raw_record(key, "", at=at)
    record["request_body"] = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **request}
    ).encode()
    reply = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "fake-model.gguf",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens},
    }
    record["response_chunks"] = [json.dumps(reply).encode()]
    return record


def ok(key: str, at: float, **request: Any) -> dict[str, Any]:
    return _record(
        key, at, request=request, message={"content": "A complete answer."}, finish="stop"
    )


def tiny_limit(key: str, at: float) -> dict[str, Any]:
    """The reply stopped at the client's own max_tokens 4."""
    return _record(
        key,
        at,
        request={"max_tokens": 4},
        message={"content": "The answ"},
        finish="length",
        completion_tokens=4,
    )


def stop_emptied(key: str, at: float) -> dict[str, Any]:
    """The client's stop list matched before any content."""
    return _record(key, at, request={"stop": ["The"]}, message={"content": ""}, finish="stop")


def budget(key: str, at: float, *, content: str) -> dict[str, Any]:
    """Thinking used max_tokens 256 up; `content` "" adds empty-content to the symptoms."""
    return _record(
        key,
        at,
        request={"max_tokens": 256},
        message={"content": content, "reasoning_content": THOUGHT},
        finish="length",
        completion_tokens=256,
    )
