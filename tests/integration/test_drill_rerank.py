"""embedding-batch on the real /v1/rerank: a crafted 1-layer BERT reranker (a classification
head, rank pooling; triage.drills.reranker) served by llama-server with `--reranking`.

The server ranks documents with the model's head (the fox-sentence document above the
harbour one); the drill's query with a ~580-token document is refused with HTTP 500 "input
(585 tokens) is too large to process ... (current batch size: 512)" at the default -ub;
captured as a pair file it is the embedding-failed finding; diagnosed, the engine replays it
on /v1/rerank, measures the pair with the server's /tokenize, launches ubatch-raised with
-ub/-b 1024 and confirms the cause (k/n), batch-split serving the cut document too, no other
cause confirmed. On a running server given by URL the cause stays untested."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import load_file
from triage.drills import build_drill
from triage.drills.rerank import LONG_PAIR_TOKENS, NAME, QUERY, SENTENCE, SHORT_DOCUMENT
from triage.drills.reranker import reference_score
from triage.drills.run import run_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.launcher import running_servers
from triage.stackfile import ServerConfig, Stack, load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

UBATCH = 512  # llama-server's default -ub, which the drill keeps


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_crafted_reranker_ranks_documents_and_refuses_a_pair_past_ubatch(
    server_factory: Any, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    server = server_factory(drill.model, list(drill.server_args))
    documents = [SHORT_DOCUMENT, SENTENCE, "the fox at dawn"]
    status, ranked = _post(f"{server.base_url}/v1/rerank", {"query": QUERY, "documents": documents})
    assert status == 200
    scores = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    assert sorted(scores) == [0, 1, 2]
    # The head scores the share of fox-sentence words: all of them > some > none, each score
    # the designed forward pass of its pair (<bos> 6 query words <eos> document <eos>; the
    # query's "the" is a topic word).
    assert scores[1] > scores[2] > scores[0]
    expected = {0: reference_score(1, 13), 1: reference_score(10, 18), 2: reference_score(3, 13)}
    assert all(abs(scores[i] - expected[i]) < 1e-4 for i in expected), (scores, expected)
    status, refused = _post(
        f"{server.base_url}/v1/rerank", drill.request("query-and-long-document")
    )
    assert status == 500
    message = refused["error"]["message"]
    assert f"input ({LONG_PAIR_TOKENS} tokens) is too large to process" in message
    assert f"(current batch size: {UBATCH})" in message
    status, split = _post(f"{server.base_url}/v1/rerank", drill.request("split"))
    assert status == 200 and len(split["results"]) == len(drill.request("split")["documents"])


def test_a_pair_longer_than_ubatch_is_confirmed_by_the_raised_batch(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    summary = run_drill(drill, log_dir=tmp_path / "drill-run", binary=server_binary)
    [saved] = summary["failing"]
    document = {
        "request": json.loads(Path(saved["request"]).read_text()),
        "response": json.loads(Path(saved["response"]).read_text()),
        "status": 500,
    }
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(document))
    (exchange,) = load_file(path)
    findings = [f.record() for f in classify(exchange)]
    refused = [f for f in findings if f.kind == "embedding-failed" and not f.passed]
    assert refused and f"{LONG_PAIR_TOKENS} tokens > physical batch {UBATCH}" in refused[0].reason
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(exchange.request, exchange=exchange.to_dict(), findings=tuple(findings)),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["embedding-batch"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == "ubatch-raised"
    base, raised, split = arms["baseline"], arms["ubatch-raised"], arms["batch-split"]
    assert base["failures"] == base["n"] >= 4
    assert raised["failures"] == 0 and raised["n"] >= 4 and raised["ci95"][1] < base["ci95"][0]
    assert "-ub/-b 1024" in raised["variant"] and "-c " not in raised["variant"]
    assert split["failures"] == 0 and split["n"] >= 4
    # The 16-bit conversion is refused the same way: not the weights.
    assert arms["alt-weights"]["failures"] == arms["alt-weights"]["n"] >= 4
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["embedding-batch"]
    inputs = {o["name"]: o for o in diagnosis["observations"]}["embedding-inputs"]
    assert inputs["endpoint"] == "/v1/rerank"
    # Measured by the server's /tokenize exactly as the refusal counts the pair.
    assert inputs["longest_tokens"] == LONG_PAIR_TOKENS and inputs["physical_batch"] == UBATCH
    skipped = {s["arm"]: s["reason"] for s in diagnosis["skipped_arms"]}
    assert "/v1/rerank" in skipped["thinking-off"]
    assert running_servers() == []


def test_a_running_reranker_by_url_leaves_the_cause_untested(
    server_factory: Any, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    server = server_factory(drill.model, list(drill.server_args))
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("query-and-long-document")),
            Stack(ServerConfig(url=server.base_url)),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    assert causes["embedding-batch"]["status"] == "suspected"
    assert not [c for c, v in causes.items() if v["status"] == "confirmed"]


def test_the_tei_form_is_answered_as_a_list_and_confirmed_the_same_way(
    server_factory: Any, tmp_path: Path
) -> None:
    """`texts` instead of `documents` (the TEI form b11434 also serves): a bare list of
    {index, score} when it fits, the same refusal when it does not; diagnosed from the
    refusal, ubatch-raised's TEI answers count as served."""
    drill = build_drill(NAME, tmp_path / "drill")
    jina = drill.request("query-and-long-document")
    tei = {"query": jina["query"], "texts": jina["documents"]}
    server = server_factory(drill.model, list(drill.server_args))
    status, ranked = _post(f"{server.base_url}/rerank", {"query": QUERY, "texts": [SENTENCE]})
    assert status == 200 and isinstance(ranked, list) and set(ranked[0]) == {"index", "score"}
    status, refused = _post(f"{server.base_url}/rerank", tei)
    assert status == 500 and "is too large to process" in refused["error"]["message"]
    server.stop()
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(tei),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    assert causes["embedding-batch"]["status"] == "confirmed"
    assert arms["ubatch-raised"]["failures"] == 0 and arms["ubatch-raised"]["n"] >= 4
    assert arms["baseline"]["failures"] == arms["baseline"]["n"] >= 4
    assert sorted(c for c, v in causes.items() if v["status"] == "confirmed") == ["embedding-batch"]
    assert running_servers() == []
