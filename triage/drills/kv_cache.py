"""The `kv-cache-quant` drill: a q4_0 KV cache erases a small V component and a near-tie flips
from a tool call to a mojibake answer.

A first-order Markov drill has no use for attention, so a KV cache cannot matter to it. This
drill adds one designed attention path (compiler.ConstantAttention): Q and K are zero (the
attention is uniform), every position stores the same V vector [1.0, 0.02, 0, ...], and the
output projection carries the 0.02 component into a spare residual dimension that raises the
logit of `<|tool_call>` by 1.0. The chain stays first order (the mean of identical V vectors
is that vector), but the small component lives in the KV cache. After the thought
(`<channel|>`, also where a thinking-off prompt ends) the model either calls get_weather or
answers in mojibake text ("Il fait beau Ã  Paris : 18 Â°C, vent lÃ©ger."), designed 0.4 / 0.6:

* f16 cache (also q8_0): the 0.02 survives, `<|tool_call>` wins (log 0.4 + 1.0 > log 0.6);
* q4_0 cache: b11434 rotates each 64-wide V chunk with a Walsh-Hadamard matrix and stores it
  in 32-value blocks scaled to the largest value; the small direction rounds to zero
  (`cache_roundtrip`), the designed 0.4 / 0.6 remains and greedy decoding answers in
  mojibake: a `mojibake` finding, no tool call.

Measured on b11434 (logprobs at that token): q4_0 -> mojibake -0.511, `<|tool_call>` -0.916
(the designed values exactly). What is real: the server, its cache quantization and rotation,
the rounding that erases a small V component beside an outlier. What is designed: the outlier,
the one-logit margin and the garbled answer; in a real model the sensitivity is spread over
many heads and layers. Weights are F16, so only the cache quantizes the path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypedDict

import numpy as np

from kb.jsontypes import JsonObject
from triage.drills import gemma4
from triage.drills.compiler import ConstantAttention, compile_design
from triage.drills.drill import (
    SERVER_ARGS,
    Drill,
    ExpectedCause,
    manifest_head,
    toml_value,
    weight_facts,
)
from triage.drills.host import host_workaround_args, host_workaround_note
from triage.drills.language import Design, Vocabulary

NAME = "kv-cache-q4"
WEIGHTS = "F16"
KV_ARGS = ["-ctk", "q4_0", "-ctv", "q4_0"]
P_CALL = 0.4  # designed probability of the tool call after the thought (the rest: mojibake)
DELTA = 1.0  # logit the attention path adds to `<|tool_call>` when the cache keeps it
# "Il fait beau à Paris : 18 °C, vent léger." as UTF-8 read as cp1252.
MOJIBAKE_ANSWER = "Il fait beau \u00c3\u00a0 Paris : 18 \u00c2\u00b0C, vent l\u00c3\u00a9ger."


def design() -> tuple[Design, int]:
    """(the chain, the token the attention path raises: `<|tool_call>`)."""
    chain = Design(name=NAME, vocab=Vocabulary.gemma4())
    vocab = chain.vocab
    # "thought" as one token, reached through merges (as in the shared drills).
    for length in range(2, len("thought") + 1):
        vocab.add("thought"[:length], score=1000.0 + length)
    opening = [vocab.byte(0x0A), vocab.id("<|channel>"), vocab.id("thought")]
    thought = chain.words(chain.chunks(gemma4.WEATHER_THOUGHT, gemma4.REASONING_PIECE))
    channel_end, call = vocab.id("<channel|>"), vocab.id("<|tool_call>")
    quote = vocab.id('<|"|>')
    answer = chain.words(chain.chunks(MOJIBAKE_ANSWER, gemma4.ANSWER_PIECE))
    chain.link([*opening, *thought, channel_end])
    chain.set(channel_end, {call: P_CALL, answer[0]: 1.0 - P_CALL})
    head = chain.words(["call:get_weather", "{location:"])
    tail = chain.words(["Paris", '<|"|>}'])
    chain.link([call, *head, quote, *tail, vocab.id("<tool_call|>"), vocab.id("<|tool_response>")])
    chain.link([*answer, vocab.id("<turn|>")])
    return chain, call


def cache_roundtrip(v: np.ndarray, cache: str) -> np.ndarray:
    """What attention reads back of a 64-value V chunk through b11434's cache: f16 as is;
    a quantized type rotated (Walsh-Hadamard), quantized in 32-value blocks, dequantized and
    rotated back (ggml's q4_0/q8_0 reference rounding). For the tests and the manifest."""
    if cache in ("f16", "f32", "bf16"):
        return v.astype(np.float16).astype(np.float64)
    h = np.ones((1, 1))
    while h.shape[0] < len(v):
        h = np.block([[h, h], [h, -h]])
    h /= math.sqrt(len(v))
    stored = h @ v
    out = np.zeros_like(stored)
    for start in range(0, len(stored), 32):
        block = stored[start : start + 32]
        if cache == "q4_0":
            peak = block[np.argmax(np.abs(block))]
            d = peak / -8
            q = np.minimum(15, np.trunc(block / d + 8.5)) if d else np.full(len(block), 8.0)
            out[start : start + 32] = (q - 8) * d
        elif cache == "q8_0":
            d = np.max(np.abs(block)) / 127
            out[start : start + 32] = np.round(block / d) * d if d else 0.0
        else:
            raise ValueError(f"no model of cache type {cache!r}")
    return np.asarray(h @ out, dtype=np.float64)


def _cause(real: bool, expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": real, "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> dict[str, ExpectedCause]:
    """Expected verdicts: kv-cache-quant confirmed, no other cause."""
    return {
        "kv-cache-quant": _cause(
            True,
            "confirmed",
            ["confirmed"],
            "With -ctk/-ctv q4_0 the V component that tips the tool call is rounded away: "
            "every greedy reply answers in mojibake without a tool call; the same server "
            "with an f16 cache calls the tool every time.",
        ),
        "reasoning-exhausts-budget": _cause(
            False, "rejected", ["rejected", "suspected"], "Failing replies stop; no length stop."
        ),
        "speculative-decoding": _cause(
            False, "rejected", ["rejected", "suspected"], "No speculative decoding configured."
        ),
        "quantized-weights": _cause(
            False, "suspected", ["suspected"], "Not testable: no alternate weights file."
        ),
        "server-build": _cause(False, "suspected", ["suspected"], "Not testable: one build."),
        "output-parsing": _cause(
            False,
            "not-confirmed",
            ["rejected", "suspected"],
            "The replies parse cleanly (a mojibake answer, no markup); thinking off changes "
            "nothing.",
        ),
        "token-limit": _cause(
            False, "rejected", ["rejected", "suspected"], "Replies are short; no length stop."
        ),
        "model-file": _cause(
            False, "suspected", ["suspected"], "Not testable: no alternate weights file."
        ),
    }


class KvCacheParameters(TypedDict):
    """The designed numbers (the manifest's `parameters`), by cache type where they differ."""

    p_call: float
    delta: float
    v_block: list[float]  # the value vector's outlier and small component
    small_component_kept: dict[str, float]
    tool_call_logit: dict[str, float]
    mojibake_answer_logit: float
    failure_rate: dict[str, dict[str, float]]  # {"temperature_0": {cache type: rate}}


def _parameters(attention: ConstantAttention) -> KvCacheParameters:
    """The designed numbers: how much of the small V component each cache type keeps, the
    resulting tool-call logit against the mojibake answer's, and the failure rate at T=0."""
    v = np.zeros(64)
    v[0], v[1] = attention.outlier, attention.small
    kept = {c: float(cache_roundtrip(v, c)[1] / attention.small) for c in ("f16", "q8_0", "q4_0")}
    call_logit = {c: math.log(P_CALL) + DELTA * k for c, k in kept.items()}
    answer_logit = math.log(1.0 - P_CALL)
    return {
        "p_call": P_CALL,
        "delta": DELTA,
        "v_block": [attention.outlier, attention.small],
        "small_component_kept": kept,
        "tool_call_logit": call_logit,
        "mojibake_answer_logit": answer_logit,
        "failure_rate": {"temperature_0": {c: float(call_logit[c] < answer_logit) for c in kept}},
    }


def build(out_dir: Path, template: str) -> Drill:
    """Write the model, manifest, request and stack.toml into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chain, call = design()
    attention = ConstantAttention(token=call, delta=DELTA)
    model = compile_design(
        chain,
        out_dir / f"{NAME}-{WEIGHTS.lower()}.gguf",
        weight_format=WEIGHTS,
        chat_template=template,
        model_name=NAME,
        attention=attention,
    )
    host_args = host_workaround_args()
    server_args = [*SERVER_ARGS, *host_args, *KV_ARGS]
    body = gemma4.weather_request()
    manifest: JsonObject = {  # manifest.json as written
        **manifest_head(NAME, template),
        "vocab_size": len(chain.vocab),
        "models": {"qat": weight_facts(model, WEIGHTS)},
        "server_args": server_args,
        "host_workaround": host_workaround_note() if host_args else None,
        "parameters": _parameters(attention),
        "requests": [
            {
                "name": "greedy",
                "role": "failing",
                "file": "request-greedy.json",
                "expect": {"failure_rate": 1.0, "tool_calls": 0, "finding": "mojibake"},
            }
        ],
        "causes": manifest_causes(),
    }
    (out_dir / "request-greedy.json").write_text(json.dumps(body, indent=2) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    drill = Drill(NAME, out_dir, {"qat": model}, manifest, [body], server_args, {})
    drill.host_note = manifest["host_workaround"]
    lines = [
        f"# Drill {NAME}: generated by triage.drills; ground truth in manifest.json",
        "[server]",
        f"model = {toml_value(model.name)}",
        f"args = {toml_value(server_args)}",
        "",
    ]
    (out_dir / "stack.toml").write_text("\n".join(lines))
    return drill
