"""Embeddings and rerank exchanges captured as a curl transcript or a HAR file (issue 24):
each is read as an exchange whose request is the one the engine replays on /v1/embeddings or
/v1/rerank, with the embedding-failed finding of llama-server's physical-batch refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy_fakes import raw_record

from triage.atlas.report import atlas_entries, match_exchange
from triage.capture import load_file
from triage.llama.endpoints import Endpoint, endpoint_of
from triage.proxy import prepare
from triage.symptoms import classify

REFUSAL = (
    "input (1041 tokens) is too large to process. increase the physical batch size "
    "(current batch size: 256)"
)
ERROR = {"error": {"code": 500, "message": REFUSAL, "type": "server_error"}}


def _failed(exchange: Any) -> dict[str, str]:
    return {f.kind: f.reason for f in classify(exchange) if not f.passed}


def test_a_curl_transcript_of_an_embeddings_refusal_is_an_embeddings_exchange(
    tmp_path: Path,
) -> None:
    path = tmp_path / "embeddings.curl"
    path.write_text(
        "curl -sS -i http://127.0.0.1:8080/v1/embeddings \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        """  -d '{"model": "m", "input": ["hello", "a long text"]}'\n"""
        "HTTP/1.1 500 Internal Server Error\n"
        "Content-Type: application/json; charset=utf-8\n\n" + json.dumps(ERROR) + "\n"
    )
    (exchange,) = load_file(path)
    assert exchange.status == 500 and endpoint_of(exchange.request) is Endpoint.EMBEDDINGS
    assert "(1041 tokens > physical batch 256)" in _failed(exchange)["embedding-failed"]


def _entry(url: str, request: dict[str, Any], status: int, response: Any) -> dict[str, Any]:
    return {
        "startedDateTime": "2026-06-10T09:14:03.120Z",
        "time": 5.0,
        "request": {
            "method": "POST",
            "url": url,
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": [],
            "queryString": [],
            "headersSize": -1,
            "bodySize": -1,
            "postData": {"mimeType": "application/json", "text": json.dumps(request)},
        },
        "response": {
            "status": status,
            "statusText": "",
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": [],
            "content": {"size": 1, "mimeType": "application/json", "text": json.dumps(response)},
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": -1,
        },
        "cache": {},
        "timings": {"send": 0, "wait": 1, "receive": 0},
    }


def test_a_har_holds_embeddings_and_rerank_entries(tmp_path: Path) -> None:
    entries = [
        _entry("http://h/v1/embeddings", {"model": "m", "input": ["a", "b"]}, 500, ERROR),
        _entry(
            "http://h/v1/rerank",
            {"model": "m", "query": "q", "documents": ["a", "b"]},
            200,
            {"results": [{"index": 0, "relevance_score": 0.5}]},
        ),
        _entry("http://h/v1/models", {"x": 1}, 200, {}),  # not an exchange the tool reads
    ]
    path = tmp_path / "session.har"
    path.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}))
    embeddings, rerank = load_file(path)
    assert endpoint_of(embeddings.request) is Endpoint.EMBEDDINGS
    assert "physical batch" in _failed(embeddings)["embedding-failed"]
    assert endpoint_of(rerank.request) is Endpoint.RERANK
    assert _failed(rerank)["embedding-failed"] == "1 rerank result(s) for 2 document(s)"


def test_the_proxy_records_an_embeddings_refusal_as_a_failing_exchange() -> None:
    record = raw_record("e1", "unused", at=1_780_000_000.0)
    record["path"] = "/v1/embeddings"
    record["request_body"] = json.dumps({"model": "m", "input": ["hello", "long"]}).encode()
    record["status"] = 500
    record["response_chunks"] = [json.dumps(ERROR).encode()]
    prepared = prepare(record, keep_success=False, replica="r")
    assert "embedding-failed" in prepared.kinds
    assert prepared.example is not None
    exchange = prepared.example["payload"]["exchange"]
    assert endpoint_of(exchange["request"]) is Endpoint.EMBEDDINGS


def test_b11434s_refusal_with_its_sizes_points_to_the_public_embeddings_incident(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pair.json"
    path.write_text(
        json.dumps(
            {"request": {"model": "m", "input": ["a", "b"]}, "response": ERROR, "status": 500}
        )
    )
    (exchange,) = load_file(path)
    matches = match_exchange(exchange, classify(exchange), atlas_entries())
    assert matches and matches[0].entry.id == "llama.cpp-12295"
    assert matches[0].entry.cause == "embedding-batch"
