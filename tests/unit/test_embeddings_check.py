"""Embeddings and rerank exchanges: the pair format reads `/v1/embeddings` and `/v1/rerank`
answers (not only chat completions), and the embedding-failed finding names a physical-batch
refusal, too few vectors, a missing vector or a NaN (printed as null)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from triage.capture import exchange_from_http, parse_pair, parse_pair_document
from triage.capture.formats.pair import pair_role
from triage.capture.model import CaptureError
from triage.checks.embeddings import batch_refusal, input_count
from triage.symptoms import classify

KIND = "embedding-failed"
# llama-server b11434's own message (tools/server/server-context.cpp), HTTP 500.
REFUSAL = {
    "error": {
        "code": 500,
        "message": "input (600 tokens) is too large to process. increase the physical batch "
        "size (current batch size: 512)",
        "type": "server_error",
    }
}


def _vectors(*vectors: list[Any]) -> dict[str, Any]:
    return {
        "object": "list",
        "model": "m",
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    }


def _failed(request: dict[str, Any], response: Any, status: int = 200) -> list[str]:
    exchange = exchange_from_http(request, response, status=status, url="http://x/v1/embeddings")
    return [f.reason for f in classify(exchange) if f.kind == KIND and not f.passed]


def test_a_pair_document_with_an_embeddings_answer_is_a_capture() -> None:
    doc = {"request": {"model": "m", "input": ["a", "b"]}, "response": _vectors([0.1], [0.2])}
    exchange = parse_pair_document(json.dumps(doc), file="emb.json")
    assert exchange.response is not None
    assert len(exchange.response["data"]) == 2
    assert not [f for f in classify(exchange) if not f.passed]  # a good answer: no finding


def test_two_files_an_embeddings_request_and_its_answer_are_told_apart(tmp_path: Path) -> None:
    request = json.dumps({"model": "m", "input": "hello"})
    response = json.dumps(_vectors([0.5, 0.25]))
    assert pair_role(request) == "request"
    assert pair_role(response) == "response"
    exchange = parse_pair(request, response, file="resp.json", request_file="req.json")
    assert exchange.request["input"] == "hello"


def test_a_rerank_answer_is_a_capture_and_a_missing_score_is_a_finding() -> None:
    request = {"model": "m", "query": "q", "documents": ["a", "b"]}
    good = {"results": [{"index": 0, "relevance_score": 0.9}, {"index": 1, "relevance_score": -1}]}
    assert _failed(request, good) == []
    bad = {"results": [{"index": 0, "relevance_score": 0.9}, {"index": 1}]}
    assert _failed(request, bad) == ["the result has no numeric relevance_score"]
    short = {"results": [{"index": 0, "relevance_score": 0.9}]}
    assert _failed(request, short) == ["1 rerank result(s) for 2 document(s)"]
    assert _failed({**request, "top_n": 1}, short) == []  # the client asked for one


def test_an_answer_that_is_neither_chat_nor_embeddings_is_refused_by_name() -> None:
    with pytest.raises(CaptureError, match=r"no `choices` \(chat\), `data` \(embeddings\)"):
        parse_pair_document(json.dumps({"request": {}, "response": {"object": "list"}}))
    with pytest.raises(CaptureError, match=r"\$\.response\.data\[0\]\.embedding"):
        doc = {"request": {}, "response": {"data": [{"embedding": 3}]}}
        parse_pair_document(json.dumps(doc))


def test_the_physical_batch_refusal_is_a_finding_with_its_sizes() -> None:
    request = {"model": "m", "input": ["x " * 600]}
    [reason] = _failed(request, REFUSAL, status=500)
    assert reason == (
        "HTTP 500: the server refused an input longer than its physical batch (-ub)"
        " (600 tokens > physical batch 512)"
    )
    # an older build's wording, without the numbers, and as a plain-text body
    older = "input is too large to process. increase the physical batch size"
    [reason] = _failed(request, older, status=500)
    assert reason == "HTTP 500: the server refused an input longer than its physical batch (-ub)"


def test_other_errors_are_not_this_finding() -> None:
    context = {
        "error": {
            "code": 400,
            "message": "input (9000 tokens) is larger than the max "
            "context size (8192 tokens). skipping",
            "type": "exceed_context_size_error",
        }
    }
    assert _failed({"input": "x"}, context, status=400) == []
    chat = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    assert _failed({"messages": [{"role": "user", "content": "hi"}]}, chat) == []


def test_too_few_missing_or_nan_vectors_are_findings() -> None:
    request = {"model": "m", "input": ["a", "b", "c"]}
    assert _failed(request, _vectors([0.1], [0.2], [0.3])) == []
    assert _failed(request, _vectors([0.1], [0.2])) == ["2 embedding(s) for 3 input(s)"]
    nan = _vectors([0.1], [None, 0.2, None], [0.3])
    assert _failed(request, nan) == ["2 value(s) are not numbers (NaN prints as null)"]
    missing = _vectors([0.1], [0.2], [])
    assert _failed(request, missing) == ["the item has no vector"]


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("one text", 1),
        ([1, 2, 3], 1),  # one tokenised input
        (["a", "b"], 2),
        ([[1, 2], [3]], 2),
        ([], 0),
        (7, None),
        (None, None),
    ],
)
def test_how_many_vectors_an_input_asks_for(value: Any, count: int | None) -> None:
    assert input_count(value) == count


def test_batch_refusal_reads_the_numbers_when_present() -> None:
    assert batch_refusal(REFUSAL["error"]["message"]) == (600, 512)
    assert batch_refusal("input is too large to process. increase the physical batch size") == (
        None,
        None,
    )
    assert batch_refusal("request (9000 tokens) exceeds the available context size") is None
