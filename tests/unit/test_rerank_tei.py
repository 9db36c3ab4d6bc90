"""The TEI form of a rerank request (`query` + `texts`), which llama-server b11434 serves on
/rerank besides the Jina form (`documents`) and answers with a bare list of `{index, score}`
(`format_response_rerank`): it is routed, measured and split like the Jina form; its answer,
in a pair document, as the second file of a pair or in a HAR entry on /rerank, is a rerank
answer the embedding-failed check reads; a refused one is the physical-batch finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from triage.capture import exchange_from_http, load_file, parse_pair, parse_pair_document
from triage.capture.formats.pair import pair_role
from triage.llama.batching import SPECIAL_TOKENS, needs_split, split_request, token_bound
from triage.llama.endpoints import Endpoint, body_problem, endpoint_of, input_texts
from triage.symptoms import classify

KIND = "embedding-failed"
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
TEI = {"query": "which animal?", "texts": ["a harbour at dawn", LONG]}
ANSWER = [{"index": 1, "score": 0.97}, {"index": 0, "score": 0.08}]
REFUSAL = {
    "error": {
        "code": 500,
        "message": "input (585 tokens) is too large to process. increase the physical batch "
        "size (current batch size: 512)",
        "type": "server_error",
    }
}


def _findings(request: dict[str, Any], response: Any, status: int) -> list[str]:
    exchange = exchange_from_http(request, response, status=status, url="http://x/rerank")
    return [f.reason for f in classify(exchange) if f.kind == KIND and not f.passed]


def test_a_tei_body_is_a_rerank_request_whose_texts_are_the_inputs() -> None:
    assert endpoint_of(TEI) is Endpoint.RERANK
    assert input_texts(TEI) == TEI["texts"]
    assert body_problem(TEI) is None
    problem = body_problem({"query": "q", "texts": ["ok", 3]})
    assert problem is not None and problem.startswith("$.texts must be")


def test_a_tei_body_is_split_in_its_own_field() -> None:
    assert needs_split(TEI, 256)
    split = split_request(TEI, 256)
    assert "documents" not in split and split["query"] == TEI["query"]
    assert len(split["texts"]) > 2 and "".join(split["texts"]).replace(" ", "") == (
        "".join(TEI["texts"]).replace(" ", "")
    )
    assert all(
        token_bound(t) + token_bound(TEI["query"]) <= 256 + SPECIAL_TOKENS for t in split["texts"]
    )


def test_a_tei_answer_is_a_rerank_answer_and_a_short_one_is_a_finding() -> None:
    assert _findings(TEI, json.dumps(ANSWER).encode(), 200) == []
    exchange = parse_pair_document(json.dumps({"request": TEI, "response": ANSWER}), file="t.json")
    assert exchange.response is not None and exchange.response["results"] == ANSWER
    short = _findings(TEI, json.dumps(ANSWER[:1]).encode(), 200)
    assert short == ["1 rerank result(s) for 2 document(s)"]
    no_score = _findings(TEI, json.dumps([{"index": 0, "score": None}, ANSWER[0]]).encode(), 200)
    assert no_score == ["the result has no numeric relevance_score"]


def test_a_refused_tei_request_is_the_physical_batch_finding() -> None:
    reasons = _findings(TEI, json.dumps(REFUSAL).encode(), 500)
    assert reasons and "585 tokens > physical batch 512" in reasons[0]


def test_two_files_a_tei_request_and_its_bare_list_answer_are_told_apart() -> None:
    request, response = json.dumps(TEI), json.dumps(ANSWER)
    assert pair_role(request) == "request" and pair_role(response) == "response"
    exchange = parse_pair(request, response, file="resp.json", request_file="req.json")
    assert exchange.response is not None and len(exchange.response["results"]) == 2
    assert endpoint_of(exchange.request) is Endpoint.RERANK


def _har_entry(url: str, request: dict[str, Any], status: int, response: Any) -> dict[str, Any]:
    def content(value: Any) -> dict[str, Any]:
        return {"mimeType": "application/json", "text": json.dumps(value)}

    return {
        "startedDateTime": "2026-06-10T09:14:03.120Z",
        "time": 5.0,
        "request": {"method": "POST", "url": url, "headers": [], "postData": content(request)},
        "response": {"status": status, "headers": [], "content": content(response)},
    }


def test_a_har_with_tei_rerank_calls_on_slash_rerank_is_read(tmp_path: Path) -> None:
    entries = [
        _har_entry("http://h/rerank", TEI, 500, REFUSAL),
        _har_entry("http://h/rerank", {**TEI, "texts": ["a", "b"]}, 200, ANSWER[:1]),
    ]
    path = tmp_path / "session.har"
    path.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}))
    refused, short = load_file(path)
    assert endpoint_of(refused.request) is Endpoint.RERANK
    reasons = [f.reason for f in classify(refused) if f.kind == KIND and not f.passed]
    assert reasons and "585 tokens > physical batch 512" in reasons[0]
    assert [f.reason for f in classify(short) if f.kind == KIND and not f.passed] == [
        "1 rerank result(s) for 2 document(s)"
    ]
