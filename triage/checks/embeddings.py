"""Built-in check `embedding-failed`: an `/v1/embeddings` or `/v1/rerank` request that did
not get one good vector (or score) per input.

llama-server cannot split an embedding or rerank input across physical batches: an input
longer than `-ub` is refused with HTTP 500 "input (N tokens) is too large to process.
increase the physical batch size (current batch size: M)" (older builds: without the
numbers). A 200 answer can still be wrong: fewer items than inputs, an item without its
vector, or a vector holding `null` (a NaN, which the server's JSON writer prints as null).
"""

from __future__ import annotations

import json
import re
from typing import Any

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _pass, check
from triage.llama.endpoints import rerank_documents_key

KIND = "embedding-failed"
MAX_TEXT = 4000
# Vectors are scanned up to this many numbers in all (a capture is already size-capped).
MAX_SCANNED = 4_000_000

_BATCH_REFUSAL = re.compile(
    r"input(?: \((?P<tokens>\d+) tokens\))? is too large to process\. "
    r"increase the physical batch size(?: \(current batch size: (?P<ubatch>\d+)\))?"
)


def batch_refusal(text: str) -> tuple[int | None, int | None] | None:
    """(input tokens, physical batch size) of llama-server's "too large to process"
    refusal in `text` (None for a number the message lacks); None when it is not there."""
    match = _BATCH_REFUSAL.search(text)
    if match is None:
        return None
    tokens, ubatch = match.group("tokens"), match.group("ubatch")
    return (int(tokens) if tokens else None, int(ubatch) if ubatch else None)


def input_count(value: Any) -> int | None:
    """How many embeddings an OpenAI `input` asks for: a string or one token list is one,
    a list of strings / token lists is one each; None when the shape is not one of these."""
    if isinstance(value, str):
        return 1
    if isinstance(value, list):
        if value and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return 1  # one tokenised input
        if all(isinstance(x, (str, list, dict)) for x in value):
            return len(value)
    return None


def _refusal_finding(view: View) -> Finding | None:
    texts = []
    if view.error is not None:
        texts.append(("$.error.message", json.dumps(view.error, default=str)[:MAX_TEXT]))
    if view.response_text:
        texts.append(("$.response_text", view.response_text[:MAX_TEXT]))
    for where, text in texts:
        found = batch_refusal(text)
        if found is None:
            continue
        tokens, ubatch = found
        status = f"HTTP {view.status}: " if view.status else ""
        sizes = ""
        if tokens is not None and ubatch is not None:
            sizes = f" ({tokens} tokens > physical batch {ubatch})"
        return Finding(
            KIND,
            False,
            1.0,
            f"{status}the server refused an input longer than its physical batch (-ub){sizes}",
            where,
        )
    return None


def _embedding_problems(view: View, data: list[Any]) -> list[Finding]:
    findings: list[Finding] = []
    expected = input_count(view.request.get("input", view.request.get("content")))
    if expected is not None and len(data) != expected:
        findings.append(
            Finding(
                KIND,
                False,
                1.0,
                f"{len(data)} embedding(s) for {expected} input(s)",
                "$.response.data",
            )
        )
    scanned = 0
    for i, item in enumerate(data):
        where = f"$.response.data[{i}].embedding"
        vector = item.get("embedding") if isinstance(item, dict) else None
        if isinstance(vector, str):
            if not vector:
                findings.append(Finding(KIND, False, 1.0, "empty base64 vector", where))
            continue
        if not isinstance(vector, list) or not vector:
            findings.append(Finding(KIND, False, 1.0, "the item has no vector", where))
            continue
        rows = vector if isinstance(vector[0], list) else [vector]  # pooling none: per token
        bad = 0
        for row in rows:
            if not isinstance(row, list):
                bad += 1
                continue
            scanned += len(row)
            if scanned > MAX_SCANNED:
                break
            bad += sum(1 for x in row if not isinstance(x, (int, float)) or isinstance(x, bool))
        if bad:
            findings.append(
                Finding(
                    KIND, False, 1.0, f"{bad} value(s) are not numbers (NaN prints as null)", where
                )
            )
        if scanned > MAX_SCANNED:
            break
    return findings


def _rerank_problems(view: View, results: list[Any]) -> list[Finding]:
    documents = view.request.get(rerank_documents_key(view.request) or "documents")
    top_n = view.request.get("top_n")
    if not isinstance(documents, list):
        return []
    expected = len(documents)
    if isinstance(top_n, int) and not isinstance(top_n, bool) and 0 < top_n < expected:
        expected = top_n
    findings = []
    if len(results) != expected:
        findings.append(
            Finding(
                KIND,
                False,
                1.0,
                f"{len(results)} rerank result(s) for {expected} document(s)",
                "$.response.results",
            )
        )
    for i, item in enumerate(results):
        # `score` in the TEI form (a request with `texts`)
        score = item.get("relevance_score", item.get("score")) if isinstance(item, dict) else None
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            findings.append(
                Finding(
                    KIND,
                    False,
                    1.0,
                    "the result has no numeric relevance_score",
                    f"$.response.results[{i}].relevance_score",
                )
            )
    return findings


@check(KIND, number=27)
def check_embedding_failed(view: View) -> list[Finding]:
    """An embeddings/rerank request refused for the physical batch, or answered with
    missing, too few or NaN vectors (scores)."""
    refusal = _refusal_finding(view)
    if refusal is not None:
        return [refusal]
    response = view.response
    if view.error is not None or response is None or "choices" in response:
        return _pass(KIND, "no embeddings or rerank answer to check")
    data, results = response.get("data"), response.get("results")
    if isinstance(data, list):
        return _embedding_problems(view, data) or _pass(
            KIND, f"{len(data)} embedding(s), every vector numeric", "$.response.data"
        )
    if isinstance(results, list):
        return _rerank_problems(view, results) or _pass(
            KIND, f"{len(results)} rerank result(s), every score numeric", "$.response.results"
        )
    return _pass(KIND, "no embeddings or rerank answer to check")


CHECKS = (check_embedding_failed,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
