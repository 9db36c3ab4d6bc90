"""Capture and classify real llama-server replies from the shared drill models.

Each drill's manifest is its ground truth (what a failing and a successful reply look
like); the findings must agree with it, for plain JSON replies and for SSE streams.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from triage.capture import Exchange, exchange_from_http, load_file
from triage.cli import cli
from triage.drills import Drill, build_drill
from triage.symptoms import USER_FACING_KINDS, failure_kinds, is_failure

pytestmark = pytest.mark.integration

BUDGET_FAILURE = {"empty-content", "length-stop", "reasoning-exhausted-budget"}
LEAK_FAILURE = {"empty-content", "tool-markup-leaked"}


@pytest.fixture(scope="module")
def server_binary() -> Path:
    from triage.llama.build import find_server_binary

    try:
        return find_server_binary()
    except Exception as exc:  # noqa: BLE001 -- any reason the binary is missing
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is not built: {exc}")
        pytest.skip(f"llama-server is not built: {exc}")


def _serve(binary: Path, drill: Drill, log_dir: Path) -> Iterator[str]:
    from triage.llama.launcher import ServerSpec, launch

    with launch(ServerSpec(binary, drill.model, list(drill.server_args)), log_dir) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def budget(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Drill, str]]:
    drill = build_drill("gemma4-thinking-budget", tmp_path_factory.mktemp("budget"))
    for url in _serve(server_binary, drill, tmp_path_factory.mktemp("budget-logs")):
        yield drill, url


@pytest.fixture(scope="module")
def toolcall(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Drill, str]]:
    drill = build_drill("gemma4-toolcall", tmp_path_factory.mktemp("toolcall"))
    for url in _serve(server_binary, drill, tmp_path_factory.mktemp("toolcall-logs")):
        yield drill, url


def _send(url: str, body: dict[str, Any], *, stream: bool) -> Exchange:
    """One real request; the reply exactly as received, captured like a probe reply."""
    from triage.llama.client import LlamaClient

    async def go() -> Any:
        async with LlamaClient(url, timeout=120) as client:
            return await (client.chat_stream(body) if stream else client.chat(body))

    result = asyncio.run(go())
    assert result.status_code == 200
    request = {**body, "stream": stream}
    return exchange_from_http(
        request, result.raw, status=result.status_code, elapsed_ms=result.elapsed * 1000
    )


def _message(exchange: Exchange) -> dict[str, Any]:
    assert exchange.response is not None
    return exchange.response["choices"][0]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_thinking_budget_greedy_fails_the_way_the_manifest_says(budget, stream):
    drill, url = budget
    expect = drill.manifest["requests"][0]["expect"]
    request = drill.request("greedy")
    assert request["max_tokens"] == 800 and request["temperature"] == 0
    exchange = _send(url, request, stream=stream)
    assert exchange.stream is stream
    assert exchange.response["choices"][0]["finish_reason"] == expect["finish_reason"] == "length"
    assert _message(exchange)["content"] == ""
    kinds = failure_kinds(exchange)
    assert BUDGET_FAILURE <= kinds
    assert kinds - BUDGET_FAILURE <= {"runaway-reasoning"}  # the drill's thought loops
    assert is_failure(exchange)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_thinking_off_contrast_does_not_fail(budget, stream):
    drill, url = budget
    request = drill.request("greedy-thinking-off")
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    exchange = _send(url, request, stream=stream)
    assert exchange.response["choices"][0]["finish_reason"] == "stop"
    assert failure_kinds(exchange) == set()
    assert not is_failure(exchange)


def test_streamed_and_plain_replies_reassemble_to_the_same_message(budget):
    drill, url = budget
    request = {**drill.request("greedy"), "cache_prompt": False}
    plain = _send(url, request, stream=False)
    streamed = _send(url, {**request, "stream_options": {"include_usage": True}}, stream=True)
    assert _message(streamed)["reasoning_content"] == _message(plain)["reasoning_content"]
    assert (
        streamed.response["usage"]["completion_tokens"]
        == plain.response["usage"]["completion_tokens"]
    )
    assert failure_kinds(streamed) == failure_kinds(plain)


def test_toolcall_replies_agree_with_the_manifest(toolcall):
    drill, url = toolcall
    expect = drill.manifest["requests"][0]["expect"]
    request = drill.request("sampled")
    seen = {"failure": 0, "success": 0}
    for seed in range(1, 13):
        for stream in (False, True):
            exchange = _send(url, {**request, "seed": seed}, stream=stream)
            message = _message(exchange)
            if message.get("tool_calls"):
                success = expect["on_success"]
                call = message["tool_calls"][0]["function"]
                assert call["name"] == success["tool"]
                assert json.loads(call["arguments"]) == success["arguments"]
                assert failure_kinds(exchange) & USER_FACING_KINDS == set()
                seen["success"] += 1
            else:
                failure = expect["on_failure"]
                assert failure["reasoning_contains"] in message["reasoning_content"]
                assert failure_kinds(exchange) == LEAK_FAILURE
                seen["failure"] += 1
    # the drill fails with probability ~q at temperature 1: both outcomes show up in 24 tries
    assert seen["failure"] and seen["success"], seen


def test_toolcall_greedy_contrast_parses_the_call(toolcall):
    drill, url = toolcall
    for stream in (False, True):
        exchange = _send(url, drill.request("greedy"), stream=stream)
        assert exchange.response["choices"][0]["finish_reason"] == "tool_calls"
        assert not is_failure(exchange)


def test_capture_command_stores_a_real_failing_reply(budget, tmp_path, monkeypatch):
    drill, url = budget
    from triage.llama.client import LlamaClient

    async def go() -> Any:
        async with LlamaClient(url, timeout=120) as client:
            return await client.chat_stream(drill.request("greedy"))

    result = asyncio.run(go())
    (tmp_path / "request.json").write_text(json.dumps({**drill.request("greedy"), "stream": True}))
    (tmp_path / "reply.sse").write_bytes(result.raw)
    monkeypatch.setenv("TRIAGE_DATABASE_URL", f"sqlite:///{tmp_path / 'kb.db'}")
    out = CliRunner().invoke(
        cli,
        [
            "capture",
            "--json",
            "--request",
            str(tmp_path / "request.json"),
            str(tmp_path / "reply.sse"),
        ],
        catch_exceptions=False,
    )
    assert out.exit_code == 0, out.output
    [item] = json.loads(out.stdout)
    assert item["format"] == "sse" and item["evidence"] == "E1"
    assert BUDGET_FAILURE <= set(item["symptoms"])
    exchange = load_file(tmp_path / "reply.sse", request=tmp_path / "request.json")[0]
    assert exchange.response["timings"]["predicted_n"] == 800
