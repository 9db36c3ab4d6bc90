"""The rerank drill `embedding-batch-rerank`: a crafted 1-layer BERT reranker
(triage.drills.reranker: a classification head, rank pooling) served with `--reranking` and
llama-server's default physical batch (`-ub` 512), asked to rank a short document and a
long one against a query. llama-server encodes the query with each document in one
physical batch (a BERT has no KV cache, so the pair cannot be split): b11434 refuses the
whole request with HTTP 500 "input (585 tokens) is too large to process. increase the
physical batch size (current batch size: 512)" (measured). The same server with `-ub`/`-b`
1024 ranks both documents, and so does the same server given the long document cut into
pieces that fit.

Exact, not a stand-in: the refusal is llama-server's own check on a real rerank model file
(architecture bert, `cls.output`), served by the real /v1/rerank. The scores are a toy (the
share of the pair's tokens that are words of the fox sentence), which the diagnosis never
reads: it decides on the refusal.
"""

from __future__ import annotations

import json
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.drills.drill import Drill, manifest_head, toml_value
from triage.drills.host import host_workaround_args, host_workaround_note
from triage.drills.reranker import compile_reranker
from triage.llama.batching import DEFAULT_UBATCH, split_request

NAME = "embedding-batch-rerank"
# -ub is left at its default (512): the usual way to meet the limit with a reranker.
RERANK_ARGS = ("--reranking", "-c", "8192", "-np", "4", "-t", "1", "-tb", "1")
SENTENCE = "the quick brown fox jumps over the lazy dog"
QUERY = "which animal is in the text"
SHORT_DOCUMENT = "a harbour at dawn"
LONG_DOCUMENT = " ".join([SENTENCE] * 64)  # 576 tokens; the pair 585 (b11434, measured)
LONG_PAIR_TOKENS = 585
WEIGHTS = {"qat": "F32", "f16": "F16"}  # the incident's file and a 16-bit conversion


def _cause(expected: str, accept: list[str], why: str) -> JsonObject:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> JsonObject:
    """Expected verdicts: embedding-batch confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "embedding-batch": _cause(
            "confirmed",
            ["confirmed"],
            "The query with the long document is longer than the default -ub 512: refused "
            "with HTTP 500; -ub/-b above its tokens (or the document split to fit) serves it.",
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "Nothing is generated: a rerank request."
        ),
        "quantized-weights": _cause(
            "not-confirmed", not_confirmed, "The 16-bit conversion is refused the same way."
        ),
        "server-build": _cause("suspected", ["suspected"], "Not testable: one build."),
        "token-limit": _cause("not-confirmed", not_confirmed, "Nothing stops on length."),
    }


def rerank_request() -> JsonObject:
    """The failing request: the query against a short and a long document."""
    return {"model": NAME, "query": QUERY, "documents": [SHORT_DOCUMENT, LONG_DOCUMENT]}


def build(out_dir: Path, template: str) -> Drill:
    """Generate the embedding-batch-rerank drill into `out_dir` (`template` unused: a
    reranker has no chat template)."""
    del template
    out_dir.mkdir(parents=True, exist_ok=True)
    models = {
        label: compile_reranker(
            out_dir / f"{NAME}-{label}.gguf", weight_format=fmt, model_name=f"{NAME}-{label}"
        )
        for label, fmt in WEIGHTS.items()
    }
    host_args = host_workaround_args()
    server_args = [*RERANK_ARGS, *host_args]
    body = rerank_request()
    manifest: JsonObject = {
        **manifest_head(NAME),
        "models": {
            label: {"file": path.name, "format": WEIGHTS[label]} for label, path in models.items()
        },
        "server_args": server_args,
        "host_workaround": host_workaround_note() if host_args else None,
        "parameters": {
            "ubatch": DEFAULT_UBATCH,
            "long_document_chars": len(LONG_DOCUMENT),
            "long_pair_tokens_b11434": LONG_PAIR_TOKENS,
            "server_flags": list(RERANK_ARGS),
        },
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "query-and-long-document",
                "role": "failing",
                "endpoint": "/v1/rerank",
                "file": "request-query-and-long-document.json",
                "expect": {
                    "status": 500,
                    "error": "is too large to process. increase the physical batch size",
                    "failure_rate": 1.0,
                },
            }
        ],
        "contrasts": [{"name": "split", "expect": {"status": 200, "failure_rate": 0.0}}],
    }
    (out_dir / "request-query-and-long-document.json").write_text(json.dumps(body, indent=2) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    contrasts = {"split": split_request(body, DEFAULT_UBATCH)}
    drill = Drill(NAME, out_dir, {"qat": models["qat"]}, manifest, [body], server_args, contrasts)
    drill.host_note = manifest["host_workaround"]
    lines = [
        f"# Drill {NAME}: generated by triage.drills; ground truth in manifest.json",
        *(
            [f"# {drill.host_note} -- added for this drill, not part of the incident"]
            if drill.host_note
            else []
        ),
        "[server]",
        f"model = {toml_value(models['qat'].name)}",
        f"args = {toml_value(server_args)}",
        "",
        "[alternates]",
        f"model = {toml_value(models['f16'].name)}",
        "",
    ]
    (out_dir / "stack.toml").write_text("\n".join(lines))
    return drill
