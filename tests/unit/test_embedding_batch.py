"""embedding-batch: an embeddings/rerank body is replayed on its own endpoint; llama-server's
physical batch as b11434 computes it (measured); the ubatch-raised arm launches with -ub/-b
past the longest measured input (and -c with them when the slot is smaller), the batch-split
arm cuts every input to fit; chat-only arms are skipped on an embeddings request; the cause
is confirmed only when an arm removes a reproduced failure."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from triage import probes
from triage.causes import ArmOutcome, Observations
from triage.engine.arms.embedding_batch import INPUTS, RAISED, SPLIT, raised_arm, raised_config
from triage.engine.causes.embedding_batch import CAUSE
from triage.llama.batching import (
    MAX_TOKENS_PER_BYTE,
    SPECIAL_TOKENS,
    physical_batch,
    split_request,
    split_text,
    token_bound,
)
from triage.llama.client import LlamaClient
from triage.llama.endpoints import Endpoint, body_problem, endpoint_of
from triage.stackfile import ServerConfig, Stack

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)
EMBED = {"model": "m", "input": ["a harbour at dawn", LONG]}
RERANK = {"model": "m", "query": "fox?", "documents": ["short", LONG]}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
ARGS = ("-c", "16384", "-np", "4", "--embeddings", "--pooling", "mean", "-ub", "256", "-b", "256")


def _stack(args: tuple[str, ...] = ARGS, url: str | None = None) -> Stack:
    if url:
        return Stack(ServerConfig(url=url))
    return Stack(ServerConfig(Path("/bin/true"), Path("/m.gguf"), args))


def test_a_body_is_sent_to_the_endpoint_its_shape_belongs_to() -> None:
    assert endpoint_of(CHAT) is Endpoint.CHAT
    assert endpoint_of(EMBED) is Endpoint.EMBEDDINGS
    assert endpoint_of({"input": "one text"}) is Endpoint.EMBEDDINGS
    assert endpoint_of(RERANK) is Endpoint.RERANK
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"data": [{"embedding": [0.1]}]})

    async def go() -> None:
        client = LlamaClient("http://x", timeout=2.0, transport=httpx.MockTransport(handler))
        try:
            for body in (EMBED, RERANK, CHAT):
                await client.chat(body)
        finally:
            await client.aclose()

    asyncio.run(go())
    assert seen == ["/v1/embeddings", "/v1/rerank", "/v1/chat/completions"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"model": "m"}, "$.messages"),
        ({"input": []}, "$.input"),
        ({"input": [{"x": 1}]}, "$.input"),
        ({"query": "q", "documents": [1]}, "$.documents"),
        ({"query": 3, "documents": ["d"]}, "$.query"),
    ],
)
def test_a_body_the_engine_cannot_replay_is_named_by_its_field(
    body: dict[str, Any], where: str
) -> None:
    problem = body_problem(body)
    assert problem is not None and problem.startswith(where)


def test_replayable_bodies_have_no_problem() -> None:
    assert body_problem(CHAT) is None
    assert body_problem(EMBED) is None
    assert body_problem({"input": [1, 2, 3]}) is None
    assert body_problem(RERANK) is None


def test_the_physical_batch_is_ubatch_capped_by_batch_and_context() -> None:
    assert physical_batch([]) == 512  # b11434 defaults: -ub 512, -b 2048
    assert physical_batch(["-ub", "256", "-b", "256"]) == 256
    assert physical_batch(["-ub", "4096", "-b", "1024"]) == 1024
    # measured: -c 2048 -ub 4096 -b 4096 answers "current batch size: 2048"
    assert physical_batch(["-c", "2048", "-ub", "4096", "-b", "4096"]) == 2048
    assert physical_batch(["--ubatch-size=128"]) == 128


def test_split_text_keeps_every_character_in_pieces_within_the_bytes() -> None:
    text = "héllo wörld " * 30 + "x" * 50
    pieces = split_text(text, 20)
    assert all(len(p.encode("utf-8")) <= 20 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")


def test_split_request_cuts_every_input_to_fit_the_batch_whatever_the_tokenizer() -> None:
    split = split_request(EMBED, 64)
    assert split["input"][0] == EMBED["input"][0]
    assert len(split["input"]) > 2
    assert all(token_bound(piece) <= 64 for piece in split["input"])
    assert EMBED["input"][1].replace(" ", "") == "".join(split["input"][1:]).replace(" ", "")
    tokens = split_request({"input": list(range(300))}, 64)["input"]
    assert [len(t) for t in tokens] == [56] * 5 + [20]
    rerank = split_request(RERANK, 64)
    assert rerank["query"] == "fox?"
    assert all(
        token_bound(d) + token_bound("fox?") <= 64 + SPECIAL_TOKENS for d in rerank["documents"]
    )


def test_token_bound_covers_a_byte_fallback_tokenizer() -> None:
    # One space a SentencePiece vocabulary without U+2581 spells as 3 byte tokens.
    assert token_bound(" ") == MAX_TOKENS_PER_BYTE + SPECIAL_TOKENS


def test_the_raised_server_holds_the_longest_measured_input() -> None:
    server = _stack().server
    facts = {
        INPUTS: {"longest_tokens": 1041, "physical_batch": 256},
        "server-props": {"n_ctx_slot": 4096, "total_slots": 4},
    }
    config = raised_config(server, facts)
    assert isinstance(config, ServerConfig)
    assert physical_batch(config.args) == 2048
    assert config.args[-4:] == ("-ub", "2048", "-b", "2048")
    assert config.args.count("-c") == 1 and "16384" in config.args  # the slot holds 2048


def test_the_context_is_raised_with_the_batch_when_the_slot_is_smaller() -> None:
    server = _stack(("-c", "4096", "-np", "4", "-ub", "256")).server
    facts = {
        INPUTS: {"longest_tokens": 1041},
        "server-props": {"n_ctx_slot": 1024, "total_slots": 4},
    }
    config = raised_config(server, facts)
    assert isinstance(config, ServerConfig)
    assert physical_batch(config.args) == 2048
    assert config.args.count("-c") == 1
    assert config.args[config.args.index("-c") + 1] == str(2048 * 4)
    arm = raised_arm(server, facts)
    assert not isinstance(arm, str) and arm.config == config
    assert arm.variant == (
        "-ub/-b 2048 (the longest input is 1041 tokens), -c 8192 (the slot's context was smaller)"
    )


def test_the_raised_arm_is_skipped_when_the_input_fits_or_was_not_measured() -> None:
    server = _stack().server
    fits = raised_config(server, {INPUTS: {"longest_tokens": 200}})
    assert isinstance(fits, str) and "fits the server's physical batch (256)" in fits
    unmeasured = raised_config(server, {INPUTS: {"error": "HTTP 404"}})
    assert isinstance(unmeasured, str) and "not measured" in unmeasured
    failed = raised_config(server, {f"{INPUTS}-observation": {"error": "RuntimeError: 404"}})
    assert isinstance(failed, str) and failed.endswith("(RuntimeError: 404)")


def test_an_embeddings_request_plans_the_batch_arms_and_skips_chat_only_arms() -> None:
    names = [arm.name for arm in probes.plan_arms(_stack(), EMBED)]
    assert {RAISED, SPLIT, INPUTS} <= set(names)
    assert "thinking-off" not in names and "reasoning-budget" not in names
    skipped = dict(probes.skipped_arms(_stack(), EMBED))
    assert skipped["thinking-off"].endswith("the request is for /v1/embeddings")
    chat = [arm.name for arm in probes.plan_arms(_stack(), CHAT)]
    assert "thinking-off" in chat
    assert not {RAISED, SPLIT, INPUTS} & set(chat)


def test_a_running_server_by_url_gets_no_batch_arm() -> None:
    names = [arm.name for arm in probes.plan_arms(_stack(url="http://127.0.0.1:9"), EMBED)]
    assert RAISED not in names and SPLIT not in names
    assert INPUTS in names


def test_short_inputs_do_not_plan_the_split() -> None:
    names = [arm.name for arm in probes.plan_arms(_stack(), {"input": ["short", "texts"]})]
    assert SPLIT not in names


def _arm(name: str, n: int, failures: int, decision: str, **kinds: int) -> ArmOutcome:
    return ArmOutcome(
        name,
        n,
        failures,
        decision,
        p_value=0.001,
        kind_counts={k.replace("_", "-"): v for k, v in kinds.items()},
    )


REFUSED = {"embedding_failed": 8, "http_error": 8}
PLANNED = Observations(
    planned=("baseline", SPLIT, RAISED),
    facts={INPUTS: {"name": INPUTS, "longest_tokens": 1041, "physical_batch": 256}},
)


def test_confirmed_when_the_raised_batch_removes_a_reproduced_refusal() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "not-run", **REFUSED),
        RAISED: _arm(RAISED, 8, 0, "removes"),
        SPLIT: _arm(SPLIT, 8, 0, "removes"),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "confirmed"
    assert verdict.deciding_probe == RAISED
    assert "0/8" in verdict.rationale and "1041 tokens" in verdict.rationale
    assert SPLIT in verdict.supports


def test_rejected_when_the_raised_batch_changes_nothing() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "not-run", **REFUSED),
        RAISED: _arm(RAISED, 8, 8, "unchanged", **REFUSED),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "rejected" and verdict.refutes == [RAISED]


def test_never_moved_on_a_baseline_that_did_not_reproduce() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 0, "not-run"),
        RAISED: _arm(RAISED, 8, 0, "no-baseline-failure"),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_rejected_on_a_failure_that_is_no_embeddings_failure() -> None:
    arms = {"baseline": _arm("baseline", 8, 8, "not-run", length_stop=8)}
    verdict = CAUSE.decide(arms, Observations(planned=("baseline", "thinking-off")))
    assert verdict.status == "rejected"
    assert "embedding-failed" in verdict.rationale


def test_rejected_when_the_longest_input_fits_the_batch() -> None:
    obs = Observations(
        planned=("baseline",),
        facts={INPUTS: {"longest_tokens": 100, "physical_batch": 512}},
    )
    arms = {"baseline": _arm("baseline", 8, 8, "not-run", embedding_failed=8)}
    verdict = CAUSE.decide(arms, obs)
    assert verdict.status == "rejected" and verdict.deciding_probe == INPUTS


def test_untested_on_a_running_server_whose_batch_is_unknown() -> None:
    obs = Observations(planned=("baseline",), facts={INPUTS: {"longest_tokens": 1041}})
    arms = {"baseline": _arm("baseline", 8, 8, "not-run", embedding_failed=8)}
    verdict = CAUSE.decide(arms, obs)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert RAISED in verdict.deciding_probe


def test_the_drill_request_is_an_embeddings_request_with_a_split_contrast(tmp_path: Path) -> None:
    from triage.drills import build_drill

    drill = build_drill("embedding-batch-ubatch", tmp_path)
    body = drill.request("short-and-long")
    assert endpoint_of(body) is Endpoint.EMBEDDINGS
    assert "--embeddings" in drill.server_args and physical_batch(drill.server_args) == 256
    split = drill.request("split")
    assert all(token_bound(piece) <= 256 for piece in split["input"])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["causes"]["embedding-batch"]["expected"] == "confirmed"
