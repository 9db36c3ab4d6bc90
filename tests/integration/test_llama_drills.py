"""The shared drills on the real llama-server b11434 with the official Gemma 4 template.

One incident server per drill (weights "qat" + speculative decoding with the draft model,
as in the reference incident) serves most tests of this module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from triage.drills import Drill, gemma4_template
from triage.drills.gemma4 import HARBOUR_PARAGRAPH
from triage.llama.client import ChatResult, LlamaClient, StreamResult
from triage.llama.launcher import RunningServer, ServerSpec, launch

pytestmark = pytest.mark.integration


def call(url: str, body: dict[str, Any], *, stream: bool = False) -> ChatResult | StreamResult:
    async def go():
        async with LlamaClient(url, timeout=120) as client:
            return await (client.chat_stream(body) if stream else client.chat(body))

    return asyncio.run(go())


def call_many(url: str, bodies: list[dict[str, Any]], slots: int = 4) -> list[ChatResult]:
    async def go():
        gate = asyncio.Semaphore(slots)
        async with LlamaClient(url, timeout=120) as client:

            async def one(body):
                async with gate:
                    return await client.chat(body)

            return await asyncio.gather(*(one(body) for body in bodies))

    return asyncio.run(go())


def inspect(url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    async def go():
        async with LlamaClient(url, timeout=30) as client:
            return await getattr(client, method)(*args, **kwargs)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def thinking_server(
    serve, thinking_drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    log_dir = tmp_path_factory.mktemp("logs")
    with serve(thinking_drill.model, thinking_drill.server_args, log_dir) as server:
        yield server


@pytest.fixture(scope="module")
def toolcall_server(
    serve, toolcall_drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    log_dir = tmp_path_factory.mktemp("logs")
    with serve(toolcall_drill.model, toolcall_drill.server_args, log_dir) as server:
        yield server


# --- gemma4-thinking-budget --------------------------------------------------------------


def test_greedy_request_reproduces_the_incident(thinking_server, thinking_drill):
    expect = thinking_drill.manifest["requests"][0]["expect"]
    result = call(thinking_server.base_url, thinking_drill.request("greedy"))
    assert result.status_code == 200
    assert result.finish_reason == "length"
    assert result.content == ""
    assert len(result.reasoning_content) == expect["reasoning_chars"]
    assert 2600 <= len(result.reasoning_content) <= 3000  # the seed measured 2797
    assert result.timings["predicted_n"] == 800
    assert result.json["system_fingerprint"] == "b11434-sdist"


def test_thinking_off_gives_the_full_answer(thinking_server, thinking_drill):
    result = call(thinking_server.base_url, thinking_drill.request("greedy-thinking-off"))
    assert result.finish_reason == "stop"
    assert result.content == HARBOUR_PARAGRAPH and len(result.content) == 687
    assert result.reasoning_content == ""


def test_reasoning_budget_cuts_the_thought_short(thinking_server, thinking_drill):
    body = {**thinking_drill.request("greedy"), "reasoning_budget_tokens": 200}
    result = call(thinking_server.base_url, body)
    assert result.finish_reason == "stop"
    assert result.content == HARBOUR_PARAGRAPH
    assert 0 < len(result.reasoning_content) < 1000


def test_token_limit_probe_fits_in_a_slot(thinking_server, thinking_drill):
    """max_tokens x4 is limited by max_tokens, not by the slot's context, and does not
    help at temperature 0: the thought loops."""
    body = {**thinking_drill.request("greedy"), "max_tokens": 3200}
    result = call(thinking_server.base_url, body)
    assert result.finish_reason == "length" and result.content == ""
    assert result.timings["predicted_n"] == 3200
    assert len(result.reasoning_content) > 10000


def test_speculative_timings_show_acceptance_below_100_percent(thinking_server, thinking_drill):
    result = call(thinking_server.base_url, thinking_drill.request("greedy"))
    drafted, accepted = result.timings["draft_n"], result.timings["draft_n_accepted"]
    assert drafted > 100
    assert 0.5 < accepted / drafted < 0.95  # the seed measured ~82%


def test_apply_template_shows_the_thinking_default(thinking_server, thinking_drill):
    body = thinking_drill.request("greedy")
    default = inspect(thinking_server.base_url, "apply_template", body)
    assert "<|turn>system\n<|think|>" in default
    assert default.endswith("<|turn>model\n")
    off = inspect(
        thinking_server.base_url,
        "apply_template",
        {**body, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert "<|think|>" not in off
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_tokenizer_facts_the_design_relies_on(thinking_server):
    url = thinking_server.base_url

    def pieces(text: str) -> list[str]:
        return [token["piece"] for token in inspect(url, "tokenize", text, with_pieces=True)]

    # The reasoning-budget sampler matches these ids against what the model writes.
    assert pieces("<|channel>thought") == ["<|channel>", "thought"]
    # The prompt with thinking on ends in the byte token <0x0A>: its successor opens the thought.
    assert pieces("<|turn>model\n")[-1] == "\n"
    assert pieces('<|"|>') == ['<|"|>']


def test_props_metrics_and_slots(thinking_server, thinking_drill):
    props = inspect(thinking_server.base_url, "props")
    assert props["chat_template"].strip() == gemma4_template().strip()
    assert "11434" in str(props["build_info"])
    assert props["model_path"].endswith("gemma4-thinking-budget-qat.gguf")
    assert "llamacpp:" in inspect(thinking_server.base_url, "metrics")
    assert len(inspect(thinking_server.base_url, "slots")) == 4


def test_stream_matches_plain(thinking_server, thinking_drill):
    body = thinking_drill.request("greedy")
    plain = call(thinking_server.base_url, body)
    stream = call(thinking_server.base_url, body, stream=True)
    assert stream.ok and stream.done
    assert stream.finish_reason == plain.finish_reason == "length"
    assert stream.reasoning_content == plain.reasoning_content
    assert stream.content == ""
    assert stream.timings["predicted_n"] == 800
    assert b"data: [DONE]" in stream.raw and stream.raw.count(b"data: ") > 100


def test_sampled_failures_are_intermittent_and_the_same_on_every_arm(
    thinking_server, thinking_drill, server_binary, plain_args, tmp_path
):
    """Same seeds on the incident server (qat + spec), spec off, and alternate weights:
    identical outcomes, so neither speculative decoding nor quantization is the cause."""
    seeds = range(1, 25)
    body = thinking_drill.request("sampled")
    bodies = [{**body, "seed": seed} for seed in seeds]

    def shapes(results: list[ChatResult]) -> list[tuple]:
        return [(r.finish_reason, len(r.content), len(r.reasoning_content)) for r in results]

    incident = call_many(thinking_server.base_url, bodies)
    arms = {}
    for label, model in (
        ("spec-off", thinking_drill.models["qat"]),
        ("mxfp4", thinking_drill.models["mxfp4"]),
    ):
        with launch(ServerSpec(server_binary, model, plain_args), tmp_path / label) as server:
            arms[label] = shapes(call_many(server.base_url, bodies))
    assert shapes(incident) == arms["spec-off"] == arms["mxfp4"]

    failures = [r for r in incident if r.finish_reason == "length"]
    expected = thinking_drill.manifest["requests"][1]["expect"]["failure_rate"]
    assert 0.25 < expected < 0.4
    # 24 draws at ~0.32: outside 1..15 has probability < 0.2%.
    assert 1 <= len(failures) <= 15, len(failures)
    for result in incident:
        if result.finish_reason == "stop":
            assert result.content == HARBOUR_PARAGRAPH
    assert all(r.timings.get("draft_n", 0) > 0 for r in incident)


# --- gemma4-toolcall ---------------------------------------------------------------------


def test_greedy_tool_call(toolcall_server, toolcall_drill):
    result = call(toolcall_server.base_url, toolcall_drill.request("greedy"))
    assert result.finish_reason == "tool_calls"
    (tool_call,) = result.tool_calls
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"]) == {"location": "Paris"}
    assert result.reasoning_content.startswith("The user asks")
    assert result.content == ""


def test_tool_call_with_thinking_off(toolcall_server, toolcall_drill):
    result = call(toolcall_server.base_url, toolcall_drill.request("sampled-thinking-off"))
    assert result.finish_reason == "tool_calls" and result.reasoning_content == ""
    assert json.loads(result.tool_calls[0]["function"]["arguments"]) == {"location": "Paris"}


def test_streamed_tool_call_is_reassembled(toolcall_server, toolcall_drill):
    stream = call(toolcall_server.base_url, toolcall_drill.request("greedy"), stream=True)
    assert stream.ok and stream.finish_reason == "tool_calls"
    assert stream.tool_calls[0]["function"]["name"] == "get_weather"
    assert json.loads(stream.tool_calls[0]["function"]["arguments"]) == {"location": "Paris"}


def test_fragile_branch_leaks_broken_call_into_reasoning(toolcall_server, toolcall_drill):
    body = {**toolcall_drill.request("sampled"), "verbose": True}
    results = call_many(toolcall_server.base_url, [{**body, "seed": s} for s in range(1, 31)])
    failed = [r for r in results if not r.tool_calls]
    # q = 0.3 over 30 draws: outside 2..18 has probability < 0.2%.
    assert 2 <= len(failed) <= 18, len(failed)
    for result in failed:
        assert result.status_code == 200 and result.finish_reason == "stop"
        assert result.content == ""
        assert "<|tool_call>call:get_weather{location:Paris}<tool_call|>" in (
            result.reasoning_content
        )
        assert result.json["__verbose"]["content"].startswith("<|channel>thought\n")
    for result in results:
        if result.tool_calls:
            arguments = json.loads(result.tool_calls[0]["function"]["arguments"])
            assert arguments == {"location": "Paris"}
