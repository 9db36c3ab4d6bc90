"""Compile a drill `Design` into a tiny 1-layer `llama` GGUF that llama-server loads.

How the network computes the designed chain: every token with designed successors gets its
own embedding dimension (a one-hot embedding). Attention and FFN output projections are zero,
so the residual stream after the only layer is still that one-hot vector; the final RMS norm
scales it by a known factor `s`, and the output matrix holds `logit / s` in that column. The
logits of the next token are therefore exactly the designed log-probabilities (unlisted tokens
get -SUPPRESSED), whatever came before the last token.

Tokens without designed successors (most byte tokens, the prompt's special tokens) share one
"fallback" dimension whose row sends the model to the design's fallback token (`<eos>`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from triage.drills.language import Design, TokenKind

SUPPRESSED = 30.0  # logit gap of tokens that must never be sampled (e^-30 ~ 1e-13)
RMS_EPS = 1e-5
HEAD_DIM = 64
FFN_WIDTH = 64
CONTEXT_LENGTH = 16384
EMBED_VALUE = 1.0

Q = gguf.GGMLQuantizationType
FT = gguf.LlamaFileType


@dataclass(frozen=True)
class WeightFormat:
    """How a weights file stores its tensors: layer matrices vs embedding/output."""

    label: str
    matrix_type: gguf.GGMLQuantizationType
    edge_type: gguf.GGMLQuantizationType  # token_embd and output
    file_type: gguf.LlamaFileType


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "F32": WeightFormat("F32", Q.F32, Q.F32, FT.ALL_F32),
    "F16": WeightFormat("F16", Q.F16, Q.F16, FT.MOSTLY_F16),
    "Q8_0": WeightFormat("Q8_0", Q.Q8_0, Q.F16, FT.MOSTLY_Q8_0),
    # Like a QAT Q4_0 release: 4-bit layer matrices, 16-bit embedding and output.
    "Q4_0": WeightFormat("Q4_0", Q.Q4_0, Q.F16, FT.MOSTLY_Q4_0),
    # Like an MXFP4 release: MXFP4 layer matrices, 32-bit embedding and output.
    "MXFP4": WeightFormat("MXFP4", Q.MXFP4, Q.F32, FT.MOSTLY_MXFP4_MOE),
}


@dataclass(frozen=True)
class ConstantAttention:
    """An attention path whose output is the same at every position, stored in the V cache.

    Q and K stay zero, so attention is uniform over the context; every position's V is the
    same vector, so its mean is that vector whatever the context (the chain stays first
    order). V holds `outlier` and `small` side by side in one 32-value quantization block;
    the output projection carries only `small`, into a spare residual dimension whose
    output row raises `token`'s logit by `delta`. A cache that keeps `small` (f16, q8_0)
    adds `delta`; q4_0 rounds it to zero next to the outlier (scale outlier/8), so the
    logit falls back to the designed one. Off (None) the model is byte-identical to before.

    llama.cpp b11434 rotates every 64-wide chunk of V with an orthonormal Walsh-Hadamard
    matrix before a quantized cache stores it, and rotates the output back (PR 21038); with
    `small` <= 0.025 x `outlier` q4_0 still rounds the small direction to zero (see
    triage.drills.kv_cache.cache_roundtrip).
    """

    token: int
    delta: float
    outlier: float = 1.0
    small: float = 0.02


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def norm_scale(width: int) -> float:
    """Factor by which RMS norm multiplies a one-hot vector of height EMBED_VALUE."""
    return EMBED_VALUE / math.sqrt(EMBED_VALUE**2 / width + RMS_EPS)


def logit_matrix(design: Design) -> tuple[np.ndarray, dict[int, int], int]:
    """(width x vocab logits, token -> embedding dimension, fallback dimension)."""
    vocab_size = len(design.vocab)
    active = sorted(design.transitions)
    dims = {token: index for index, token in enumerate(active)}
    fallback_dim = len(active)
    width = _round_up(fallback_dim + 1, HEAD_DIM)
    logits = np.full((width, vocab_size), -SUPPRESSED, dtype=np.float64)
    for token, successors in design.transitions.items():
        row = logits[dims[token]]
        for successor, probability in successors.items():
            row[successor] = math.log(probability)
    logits[fallback_dim, design.vocab.id(design.fallback)] = 0.0
    return logits, dims, fallback_dim


def _tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, kind: Q) -> None:
    data = np.ascontiguousarray(array, dtype=np.float32)
    if kind == Q.F32:
        writer.add_tensor(name, data)
    elif kind == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


def _write_tokenizer(writer: gguf.GGUFWriter, design: Design, chat_template: str | None) -> None:
    """The SPM tokenizer of the design's vocabulary, its special ids and the chat template."""
    tokens = design.vocab.tokens
    writer.add_tokenizer_model("llama")
    writer.add_token_list([token.text for token in tokens])
    writer.add_token_scores([float(token.score) for token in tokens])
    writer.add_token_types([int(token.kind) for token in tokens])
    writer.add_bos_token_id(design.vocab.id("<bos>"))
    writer.add_eos_token_id(design.vocab.id("<eos>"))
    writer.add_unk_token_id(design.vocab.id("<unk>"))
    writer.add_pad_token_id(design.vocab.id("<pad>"))
    # The Gemma 4 template writes {{ bos_token }} itself; a second BOS from the tokenizer
    # would only add a warning.
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def compile_design(
    design: Design,
    path: Path,
    *,
    weight_format: str = "F32",
    chat_template: str | None = None,
    model_name: str | None = None,
    attention: ConstantAttention | None = None,
) -> Path:
    """Write `design` as a GGUF file at `path` and return the path."""
    design.validate()
    fmt = WEIGHT_FORMATS[weight_format]
    logits, dims, fallback_dim = logit_matrix(design)
    if attention is not None and fallback_dim + 1 >= logits.shape[0]:
        # The attention path needs one spare residual dimension.
        spare = np.full((HEAD_DIM, logits.shape[1]), -SUPPRESSED, dtype=np.float64)
        logits = np.vstack([logits, spare])
    width, vocab_size = logits.shape
    scale = norm_scale(width)

    embedding = np.zeros((vocab_size, width), dtype=np.float32)
    for token in range(vocab_size):
        embedding[token, dims.get(token, fallback_dim)] = EMBED_VALUE
    # ggml's output.weight is [width, vocab]: numpy row = next token, column = dimension.
    output = (logits.T / scale).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(model_name or design.name)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(width)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN_WIDTH)
    writer.add_head_count(width // HEAD_DIM)
    writer.add_head_count_kv(width // HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(int(fmt.file_type))
    if fmt.matrix_type not in (Q.F32, Q.F16):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    _write_tokenizer(writer, design, chat_template)

    zeros_square = np.zeros((width, width), dtype=np.float32)
    attn = {name: zeros_square for name in ("attn_q", "attn_k", "attn_v", "attn_output")}
    if attention is not None:
        attn["attn_v"], attn["attn_output"] = _constant_attention(attention, width, scale)
        output[:, width - 1] = 0.0
        output[attention.token, width - 1] = attention.delta / (scale * attention.small)
    _tensor(writer, "token_embd.weight", embedding, fmt.edge_type)
    _tensor(writer, "output_norm.weight", np.ones(width), Q.F32)
    _tensor(writer, "output.weight", output, fmt.edge_type)
    _tensor(writer, "blk.0.attn_norm.weight", np.ones(width), Q.F32)
    for name, matrix in attn.items():
        _tensor(writer, f"blk.0.{name}.weight", matrix, fmt.matrix_type)
    _tensor(writer, "blk.0.ffn_norm.weight", np.ones(width), Q.F32)
    _tensor(writer, "blk.0.ffn_gate.weight", np.zeros((FFN_WIDTH, width)), fmt.matrix_type)
    _tensor(writer, "blk.0.ffn_up.weight", np.zeros((FFN_WIDTH, width)), fmt.matrix_type)
    _tensor(writer, "blk.0.ffn_down.weight", np.zeros((width, FFN_WIDTH)), fmt.matrix_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _constant_attention(
    attention: ConstantAttention, width: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(attn_v, attn_output) of a ConstantAttention: numpy row = output, column = input.

    Every normalized input is `scale` on one dimension, so a row of `value / scale` gives V
    component `value` for every token. The last residual dimension is the spare one."""
    v = np.zeros((width, width), dtype=np.float32)
    v[0, :] = attention.outlier / scale
    v[1, :] = attention.small / scale
    o = np.zeros((width, width), dtype=np.float32)
    o[width - 1, 1] = 1.0
    return v, o


def stop_tokens(design: Design) -> set[int]:
    """Control tokens llama.cpp treats as end-of-generation for Gemma 4 vocabularies."""
    names = ("<eos>", "<turn|>", "<|tool_response>")
    return {
        design.vocab.id(name)
        for name in names
        if name in design.vocab.index
        and design.vocab.tokens[design.vocab.id(name)].kind == TokenKind.CONTROL
    }
