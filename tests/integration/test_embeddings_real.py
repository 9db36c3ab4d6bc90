"""Embeddings on the real llama-server: a drill model served with `--embeddings` (mean
pooling, so an input cannot be split across physical batches) answers a short input with one
numeric vector each, and refuses an input longer than `-ub` with HTTP 500 "input (N tokens)
is too large to process. increase the physical batch size" -- the embedding-failed finding;
the same input on a server whose `-ub`/`-b` cover it gets its vector."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.drills import Drill
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

UBATCH = 32
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)  # well above 32 tokens


def _args(ubatch: int) -> list[str]:
    return [
        *("-c", "2048", "-np", "1", "-t", "1", "-tb", "1"),
        *("--embeddings", "--pooling", "mean", "-ub", str(ubatch), "-b", str(ubatch)),
    ]


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 loopback
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _tokens(base_url: str, text: str) -> int:
    status, raw = _post(f"{base_url}/tokenize", {"content": text})
    assert status == 200
    return len(json.loads(raw)["tokens"])


def _failed(request: dict[str, Any], status: int, raw: bytes) -> list[str]:
    exchange = exchange_from_http(request, raw, status=status, url="http://x/v1/embeddings")
    return [f.reason for f in classify(exchange) if f.kind == "embedding-failed" and not f.passed]


def test_an_input_longer_than_ubatch_is_refused_and_a_larger_ubatch_serves_it(
    server_factory: Any, thinking_drill: Drill, tmp_path: Path
) -> None:
    server = server_factory(thinking_drill.model, _args(UBATCH))
    url = f"{server.base_url}/v1/embeddings"
    tokens = _tokens(server.base_url, LONG)
    assert tokens > UBATCH

    short = {"model": "drill", "input": ["hello", "world"]}
    status, raw = _post(url, short)
    assert status == 200
    assert len(json.loads(raw)["data"]) == 2
    assert _failed(short, status, raw) == []

    long = {"model": "drill", "input": ["hello", LONG]}
    status, raw = _post(url, long)
    assert status == 500
    [reason] = _failed(long, status, raw)
    assert "refused an input longer than its physical batch (-ub)" in reason
    assert f"> physical batch {UBATCH})" in reason
    server.stop()

    # -ub/-b at least the longest input's tokens (measured with /tokenize): the vector comes.
    raised = server_factory(thinking_drill.model, _args(max(64, tokens + 8)))
    status, raw = _post(f"{raised.base_url}/v1/embeddings", long)
    assert status == 200, raw[:500]
    assert _failed(long, status, raw) == []
