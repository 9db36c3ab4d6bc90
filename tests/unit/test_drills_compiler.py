"""The compiler writes a GGUF whose forward pass yields exactly the designed distribution."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from triage.drills.compiler import (
    RMS_EPS,
    SUPPRESSED,
    WEIGHT_FORMATS,
    compile_design,
    logit_matrix,
)
from triage.drills.language import Design, TokenKind, Vocabulary


def small_design() -> Design:
    design = Design("tiny", Vocabulary.gemma4())
    a, b, c = design.words(["alpha", "beta", "gamma"])
    turn_end = design.vocab.id("<turn|>")
    design.link([design.vocab.byte(0x0A), a])
    design.set(a, {b: 0.85, c: 0.15})
    design.link([b, a])
    design.set(c, {turn_end: 1.0})
    return design


def tensors(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    out = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        out[tensor.name] = np.asarray(data, dtype=np.float64).reshape(
            [int(n) for n in reversed(tensor.shape.tolist())]
        )
    return out


def forward(weights: dict[str, np.ndarray], token: int) -> np.ndarray:
    """The llama block with zero attention/FFN outputs, then norm and LM head."""
    hidden = weights["token_embd.weight"][token]
    attention = weights["blk.0.attn_output.weight"] @ np.zeros_like(hidden)
    ffn = weights["blk.0.ffn_down.weight"] @ np.zeros(weights["blk.0.ffn_down.weight"].shape[1])
    hidden = hidden + attention + ffn
    normed = hidden / math.sqrt(float(np.mean(hidden**2)) + RMS_EPS)
    normed = normed * weights["output_norm.weight"]
    return weights["output.weight"] @ normed


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


@pytest.mark.parametrize("fmt", sorted(WEIGHT_FORMATS))
def test_forward_pass_reproduces_the_design(tmp_path: Path, fmt: str):
    design = small_design()
    path = compile_design(
        design, tmp_path / f"tiny-{fmt}.gguf", weight_format=fmt, chat_template="{{ messages }}"
    )
    weights = tensors(path)
    # Quantized layer matrices are all zero, so they contribute exactly nothing.
    for name in ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight"):
        assert not weights[name].any()
    for token, successors in design.transitions.items():
        probabilities = softmax(forward(weights, token))
        for successor, wanted in successors.items():
            assert probabilities[successor] == pytest.approx(wanted, abs=2e-3)
        assert sum(probabilities[s] for s in successors) > 1 - 1e-6
    # Tokens without a design fall back to <eos>.
    fallback = softmax(forward(weights, design.vocab.id("<|think|>")))
    assert fallback.argmax() == design.vocab.id("<eos>")


def test_metadata_and_tensor_types(tmp_path: Path):
    design = small_design()
    path = compile_design(
        design, tmp_path / "q.gguf", weight_format="Q4_0", chat_template="TEMPLATE"
    )
    reader = gguf.GGUFReader(str(path))

    def value(key: str):
        return reader.fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("llama.block_count") == 1
    assert value("general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    assert value("tokenizer.ggml.model") == "llama"
    assert value("tokenizer.chat_template") == "TEMPLATE"
    assert value("tokenizer.ggml.add_bos_token") is False
    assert value("tokenizer.ggml.add_space_prefix") is False
    assert len(value("tokenizer.ggml.tokens")) == len(design.vocab)
    types = value("tokenizer.ggml.token_type")
    assert types[design.vocab.id('<|"|>')] == TokenKind.USER_DEFINED
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == "Q4_0"
    assert kinds["output.weight"] == "F16" and kinds["token_embd.weight"] == "F16"


def test_logit_matrix_width_and_suppression():
    design = small_design()
    logits, dims, fallback_dim = logit_matrix(design)
    assert logits.shape[0] % 64 == 0 and logits.shape[0] > fallback_dim
    assert len(dims) == len(design.transitions)
    row = logits[dims[design.vocab.id("gamma")]]
    assert row[design.vocab.id("<turn|>")] == 0.0  # log(1)
    assert sorted(row)[-2] == -SUPPRESSED  # every other token


def test_compile_is_fast(tmp_path: Path):
    import time

    design = small_design()
    started = time.monotonic()
    compile_design(design, tmp_path / "t.gguf", weight_format="MXFP4")
    assert time.monotonic() - started < 1.0
