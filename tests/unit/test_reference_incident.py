"""The committed reference incident carries every fact of the retrospective, and nothing more.

These tests read the files directly (no database): they pin the numbers, the statuses and
the honesty notes, so an edit that drops or changes one fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.repo.fileparse import parse_file

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
GEMMA = "2026-06-10-gemma4-empty-response"
QWEN = (
    "2026-05-01-qwen-echo-response-latency",
    "2026-05-01-qwen-internal-tool-run-to-completion",
)


@pytest.fixture(scope="module")
def gemma() -> dict[str, Any]:
    return parse_file(INCIDENTS / f"{GEMMA}.md")


def _evidence(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["id"]: item for item in record["evidence"]}


def _find_payload(record: dict[str, Any], **expected: Any) -> dict[str, Any]:
    """The one evidence payload holding all `expected` key/values."""
    matches = [
        item
        for item in record["evidence"]
        if all(item.get("payload", {}).get(k) == v for k, v in expected.items())
    ]
    assert len(matches) == 1, (expected, [m["id"] for m in matches])
    return matches[0]


def _cause(record: dict[str, Any], key: str) -> dict[str, Any]:
    return next(cause for cause in record["causes"] if cause["id"] == key)


def _linked(cause: dict[str, Any], relation: str) -> set[str]:
    return {link["id"] for link in cause["evidence"] if link["relation"] == relation}


def test_header_and_stack(gemma: dict[str, Any]) -> None:
    assert gemma["slug"] == GEMMA
    assert gemma["opened"] == "2026-06-10"
    assert gemma["status"] == "parked"
    assert "closed" not in gemma
    stack = gemma["stack"]
    assert stack["server_build"] == "b9586"
    assert "QAT Q4" in stack["weights"] and "MXFP4" in stack["weights"]
    assert stack["clients"] == ["Cline", "opencode"]
    assert "draft-MTP" in stack["speculative"]
    assert "thinking_default" in stack


def test_symptoms(gemma: dict[str, Any]) -> None:
    kinds = {s["kind"]: s for s in gemma["symptoms"]}
    assert set(kinds) == {"empty-content", "broken-tool-call", "runaway-reasoning", "intermittent"}
    error = "Error: empty or unparsable response from the model. Retrying may help."
    assert kinds["empty-content"]["observed"]["error"] == error
    scope = kinds["intermittent"]["observed"]
    assert (scope["simple_single_tool_requests"], scope["simple_single_tool_ok"]) == (8, 8)
    # The frequency was never measured: no rate is invented.
    assert scope["failure_rate"] is None and scope["failure_rate_measured"] is False


def test_onset_after_three_simultaneous_changes(gemma: dict[str, Any]) -> None:
    onset = _find_payload(gemma, weights_before="MXFP4", weights_after="QAT Q4")
    assert onset["payload"]["speculative_added"] == "draft-MTP"
    assert onset["payload"]["llama_cpp_build_after"] == "b9586"
    assert "2026-06-10" in onset["summary"]


def test_quantization_rejected_by_the_ab(gemma: dict[str, Any]) -> None:
    cause = _cause(gemma, "quantized-weights")
    assert (cause["status"], cause["basis"]) == ("rejected", "measured")
    ab = _find_payload(gemma, seed=42)
    assert ab["kind"] == "measurement"
    assert ab["payload"]["prompts"] == ["reasoning", "code", "fact", "Korean"]
    assert set(ab["payload"]["result"].values()) == {"tie", "tie, QAT slightly better"}
    assert ab["payload"]["result"]["Korean"] == "tie, QAT slightly better"
    bat = _find_payload(gemma, question="bat-and-ball")
    assert bat["payload"]["MXFP4"] == bat["payload"]["QAT Q4"] == "$0.05"
    aime = _find_payload(gemma, correct_answer=738)
    assert (aime["payload"]["gemma_answer"], aime["payload"]["samples"]) == (657, 1)
    assert {ab["id"], bat["id"]} <= _linked(cause, "refutes")
    assert aime["id"] in _linked(cause, "context")  # a model ceiling, not quantization
    assert [h["to"] for h in cause["history"]] == ["suspected", "rejected"]


def test_thinking_default_confirmed_with_the_measurements(gemma: dict[str, Any]) -> None:
    cause = _cause(gemma, "reasoning-exhausts-budget")
    assert (cause["status"], cause["basis"]) == ("confirmed", "measured")
    on = _find_payload(gemma, reasoning_len=2797)
    assert on["payload"]["content_len"] == 0
    assert on["payload"]["finish_reason"] == "length"
    assert on["payload"]["max_tokens"] == 800
    off = _find_payload(gemma, content_len=687)
    assert off["payload"]["finish_reason"] == "stop"
    assert off["payload"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "/no_think" in off["payload"]["prompt"]
    ocr = _find_payload(gemma, latency_s=1.4)
    assert ocr["payload"]["thinking"] == "off" and ocr["payload"]["correct"] is True
    assert {on["id"], off["id"], ocr["id"]} <= _linked(cause, "supports")
    assert cause["history"][-1]["evidence"] == [on["id"], off["id"]]


def test_qat_flipped_the_default_stays_inferred(gemma: dict[str, Any]) -> None:
    cause = _cause(gemma, "qat-flipped-thinking-default")
    assert cause["catalogue"] == "reasoning-exhausts-budget"
    assert (cause["status"], cause["basis"]) == ("suspected", "inferred")
    assert "not re-verified" in cause["rationale"]


def test_speculative_decoding_suspected_with_the_numbers(gemma: dict[str, Any]) -> None:
    cause = _cause(gemma, "speculative-decoding")
    assert (cause["status"], cause["basis"]) == ("suspected", "inferred")
    speed = _find_payload(gemma, decode_tok_s_without=80.8)
    payload = speed["payload"]
    assert payload["decode_tok_s_with"] == 109.3
    assert payload["speedup_percent"] == 35
    assert round((109.3 / 80.8 - 1) * 100) == 35
    assert (payload["draft_acceptance"], payload["acceptance_samples"]) == (0.82, 2)
    assert (
        "distribution is preserved, not that the committed tokens are identical"
        in (cause["rationale"])
    )
    assert "tool-call JSON" in cause["rationale"]


def test_server_build_and_output_parsing_suspected(gemma: dict[str, Any]) -> None:
    for key in ("server-build", "output-parsing"):
        cause = _cause(gemma, key)
        assert (cause["status"], cause["basis"]) == ("suspected", "inferred")
        assert "#21326" in cause["rationale"] and "#21343" in cause["rationale"]
        assert "--jinja" in cause["rationale"]
    assert "reasoning field" in _cause(gemma, "output-parsing")["title"]


def test_token_limit_is_not_claimed(gemma: dict[str, Any]) -> None:
    assert "token-limit" not in {c["id"] for c in gemma["causes"]}
    assert {c["catalogue"] for c in gemma["causes"]} == {
        "quantized-weights",
        "reasoning-exhausts-budget",
        "speculative-decoding",
        "server-build",
        "output-parsing",
    }


def test_references(gemma: dict[str, Any]) -> None:
    urls = {ref.get("url") for ref in gemma["references"]}
    assert {
        "https://github.com/ggml-org/llama.cpp/issues/23335",
        "https://github.com/ggml-org/llama.cpp/issues/23302",
        "https://github.com/ggml-org/llama.cpp/issues/23752",
        "https://github.com/ggml-org/llama.cpp/pull/21326",
        "https://github.com/ggml-org/llama.cpp/pull/21343",
        "https://github.com/abetlen/llama-cpp-python/issues/2227",
        "https://arxiv.org/abs/2505.11574",
    } <= urls
    titled = {ref["title"]: ref for ref in gemma["references"]}
    google = next(t for t in titled if t.startswith("Google: Gemma 4"))
    assert "2026-06-05" in google
    # No address was given in the source, so none is made up.
    assert "url" not in titled[google]


def test_parked_decision(gemma: dict[str, Any]) -> None:
    (decision,) = gemma["decisions"]
    assert decision["kind"] == "PARKED"
    assert decision["at"] == "2026-06-10"
    assert "non-core" in decision["rationale"]
    assert "thinking off by default on the server" in decision["fix"]
    assert "not a verified fix" in decision["fix"]
    assert decision["verified"] is False
    assert "35%" in decision["tradeoff"]
    assert decision["revisit_on"] == "2026-09-10"
    assert [t["kind"] for t in decision["triggers"]] == ["new-build", "new-weights", "failure-rate"]


def test_lessons_in_the_body(gemma: dict[str, Any]) -> None:
    body = gemma["body"]
    assert "## Lessons" in body
    for phrase in ("measurement", "easy to switch off and hard to bound", "+35% speed"):
        assert phrase in body


@pytest.mark.parametrize("slug", QWEN)
def test_qwen_incidents_are_the_same_family_and_invent_nothing(
    gemma: dict[str, Any], slug: str
) -> None:
    record = parse_file(INCIDENTS / f"{slug}.md")
    assert record["opened"] < gemma["opened"]
    assert "Qwen" in record["stack"]["model"]
    assert "not recorded" in record["summary"]
    assert "not recorded" in record["body"]
    # No measured numbers: the only evidence is the retrospective's account.
    for item in record["evidence"]:
        assert item["kind"] == "observation"
        assert item["payload"]["numbers_recorded"] is False
    (cause,) = record["causes"]
    assert cause["id"] == "reasoning-exhausts-budget"
    assert cause["basis"] == "inferred"
    links = {(f["incident"], f["other_cause"]) for f in record["family"]}
    assert (GEMMA, "reasoning-exhausts-budget") in links
    back = {(f["cause"], f["incident"]) for f in gemma["family"]}
    assert ("reasoning-exhausts-budget", slug) in back
