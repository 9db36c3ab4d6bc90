"""The embeddings drill `embedding-batch-ubatch`: a 1-layer drill model served with
`--embeddings --pooling mean -ub 256 -b 256` (mean pooling: an input is encoded in one
physical batch), asked for the vectors of a short text and a long one (about a thousand
tokens with this vocabulary). b11434 refuses the whole request with HTTP 500 "input (N
tokens) is too large to process. increase the physical batch size (current batch size:
256)" (measured); the same server with `-ub`/`-b` above the long input's tokens answers two
vectors, and so does the same server given the inputs cut into pieces of at most 82 bytes.
Exact, not a stand-in: the refusal is llama-server's own batch check, on any model. The
model is a drill (no small embedding GGUF ships in a registry package we found); a decoder
served with mean pooling exercises the same check a BERT-style embedder does.
"""

from __future__ import annotations

from pathlib import Path

from kb.jsontypes import JsonObject
from triage.drills import gemma4
from triage.drills.drill import Drill, finish
from triage.llama.batching import split_request

NAME = "embedding-batch-ubatch"
UBATCH = 256
EMBEDDING_ARGS = ("--embeddings", "--pooling", "mean", "-ub", str(UBATCH), "-b", str(UBATCH))
SENTENCE = "the quick brown fox jumps over the lazy dog"
LONG_INPUT = " ".join([SENTENCE] * 20)  # 1041 tokens with the drill's vocabulary (b11434)
SHORT_INPUT = "a harbour at dawn"


def _cause(expected: str, accept: list[str], why: str) -> JsonObject:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> JsonObject:
    """Expected verdicts: embedding-batch confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "embedding-batch": _cause(
            "confirmed",
            ["confirmed"],
            "The long input is longer than -ub 256: refused with HTTP 500; -ub/-b above its "
            "tokens (or the input split to fit) serves it.",
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "Nothing is generated: an embeddings request."
        ),
        "speculative-decoding": _cause(
            "not-confirmed", not_confirmed, "Without the draft model: refused the same way."
        ),
        "quantized-weights": _cause(
            "not-confirmed", not_confirmed, "The mxfp4 weights are refused the same way."
        ),
        "server-build": _cause("suspected", ["suspected"], "Not testable: one build."),
        "token-limit": _cause("not-confirmed", not_confirmed, "Nothing stops on length."),
    }


def build(out_dir: Path, template: str) -> Drill:
    """Generate the embedding-batch-ubatch drill into `out_dir` (the thinking-budget model,
    served for embeddings)."""
    spec = gemma4.thinking_budget_design()
    body: JsonObject = {"model": NAME, "input": [SHORT_INPUT, LONG_INPUT]}
    manifest = {
        "parameters": {
            "ubatch": UBATCH,
            "long_input_chars": len(LONG_INPUT),
            "long_input_tokens_b11434": 1041,
            "server_flags": list(EMBEDDING_ARGS),
        },
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "short-and-long",
                "role": "failing",
                "endpoint": "/v1/embeddings",
                "expect": {
                    "status": 500,
                    "error": "is too large to process. increase the physical batch size",
                    "failure_rate": 1.0,
                },
            }
        ],
        "contrasts": [{"name": "split", "expect": {"status": 200, "failure_rate": 0.0}}],
    }
    return finish(
        NAME,
        spec,
        out_dir,
        template,
        manifest,
        [body],
        {"split": split_request(body, UBATCH)},
        extra_args=EMBEDDING_ARGS,
    )
