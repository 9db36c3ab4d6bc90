"""Compile the smallest reranker llama-server b11434 serves with `--reranking`: a 1-layer
`bert` GGUF with a classification head (`cls.output`), non-causal, rank pooling.

Why BERT (read in b11434's source): `/v1/rerank` needs pooling `rank` (`--reranking`;
`tools/server/server-context.cpp`, post_rerank), and rank pooling applies the head tensors
`cls` / `cls.output` that only classifier architectures load (`src/models/bert.cpp`,
`qwen3.cpp`, ...; `llama-graph.cpp` build_pooling). A causal reranker (qwen3 with
`cls.output`) has a KV cache, so the server splits its input over several batches
(`server_slot::can_split`: "causal rerankers ... can also be chunked/split") and never refuses
a long pair; a BERT has no memory, so the query + document is encoded in ONE physical batch
and a pair longer than `-ub` is refused -- the embedding-batch failure on /v1/rerank.

What the network computes (every number below is exact up to LayerNorm's epsilon):

* Each token embeds as `[t, -t, 0, ...]` with t = +1 for a "topic" word (a word of
  `TOPIC`) and -1 for anything else (specials, bytes, other words); the embedding
  LayerNorm turns that into `s * [t, -t, 0, ...]`.
* Q and K are zero, so attention is uniform over the pair's tokens (non-causal: all of
  them); V copies `t` into dimension 2, so every position receives the pair's mean `m` of t.
* The FFN is zero; after the two LayerNorms dimension 2 at the first token (rank pooling
  reads the first token of a non-causal sequence) is ~`m` (the |s * t| ~ 5.7 of dimensions
  0/1 keeps the norm near one), and `cls.output` maps it to `(m + 1) / 2`.

So `relevance_score` is about the share of the pair's tokens that are topic words: a
document made of TOPIC words ranks above one that is not. A toy relevance (the query
only adds to the pair's tokens), but a real classification head on the real server.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

from triage.drills.language import SPACE, TokenKind, Vocabulary

__all__ = [
    "TOPIC",
    "WEIGHT_FORMATS",
    "WIDTH",
    "build_vocabulary",
    "compile_reranker",
    "reference_score",
]

WIDTH = 64  # n_embd = one head of 64
FFN_WIDTH = 64
CONTEXT_LENGTH = 8192  # position_embd rows: positions a pair may reach
NORM_EPS = 1e-12  # BERT's LayerNorm epsilon
RANK_POOLING = 4  # LLAMA_POOLING_TYPE_RANK
TOPIC = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog")
OTHER = ("a", "harbour", "at", "dawn", "which", "animal", "is", "in", "text", "boats", "sail")


def build_vocabulary() -> tuple[Vocabulary, set[int]]:
    """The SPM vocabulary (<unk> <bos> <eos> <pad>, 256 bytes, whole words with and without
    a leading space) and the ids of the topic words."""
    vocab = Vocabulary()
    vocab.add("<unk>", TokenKind.UNKNOWN)
    vocab.add("<bos>", TokenKind.CONTROL)
    vocab.add("<eos>", TokenKind.CONTROL)
    vocab.add("<pad>", TokenKind.CONTROL)
    for byte in range(256):
        vocab.add(f"<0x{byte:02X}>", TokenKind.BYTE)
    # llama.cpp's SPM tokenizer reaches a token only through merges of two symbols that are
    # tokens themselves: every prefix of a word (2 characters on) is one, scored by length
    # so the longest merge wins and each word is one token.
    words = [(text, word in TOPIC) for word in (*TOPIC, *OTHER) for text in (SPACE + word, word)]
    for text, _ in words:
        for length in range(2, len(text)):
            if text[:length] not in vocab.index:
                vocab.add(text[:length], score=100.0 + length)
    topic: set[int] = set()
    for text, is_topic in words:
        token = vocab.index.get(text)
        if token is None:
            token = vocab.add(text, score=100.0 + len(text))
        if is_topic:
            topic.add(token)
    return vocab, topic


def _scale() -> float:
    """What the embedding LayerNorm multiplies `[t, -t, 0, ...]` by."""
    return 1.0 / math.sqrt(2.0 / WIDTH + NORM_EPS)


WEIGHT_FORMATS = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16}


def reference_score(topic_tokens: int, tokens: int) -> float:
    """The score the network computes for a pair of `tokens` tokens (specials included), of
    which `topic_tokens` are topic words, the first token (BOS) not one: the forward pass
    above in float64, LayerNorm epsilon included."""
    if not 0 <= topic_tokens < tokens:
        raise ValueError("need 0 <= topic_tokens < tokens (the BOS is never a topic word)")
    s = _scale()
    mean_t = (2 * topic_tokens - tokens) / tokens
    first = np.zeros(WIDTH)
    first[0], first[1], first[2] = -s, s, mean_t  # BOS (t = -1) plus the attention output

    def layer_norm(x: np.ndarray) -> np.ndarray:
        centred = x - x.mean()
        return np.asarray(centred / math.sqrt(float((centred**2).mean()) + NORM_EPS))

    return 0.5 * float(layer_norm(layer_norm(first))[2]) + 0.5


def _tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, f16: bool = False) -> None:
    data = np.ascontiguousarray(array, dtype=np.float32)
    writer.add_tensor(name, data.astype(np.float16) if f16 and data.ndim == 2 else data)


def compile_reranker(
    path: Path, *, weight_format: str = "F32", model_name: str = "drill-reranker"
) -> Path:
    """Write the reranker GGUF at `path` (about 2.3 MB in F32; "F16" stores the matrices in
    16 bits, the norms and biases in 32, as a conversion does) and return the path."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {sorted(WEIGHT_FORMATS)}")
    f16 = weight_format == "F16"
    vocab, topic = build_vocabulary()
    n_vocab = len(vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch="bert")
    writer.add_name(model_name)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN_WIDTH)
    writer.add_head_count(1)
    writer.add_layer_norm_eps(NORM_EPS)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(RANK_POOLING))
    writer.add_file_type(int(WEIGHT_FORMATS[weight_format]))

    writer.add_tokenizer_model("llama")
    writer.add_token_list([token.text for token in vocab.tokens])
    writer.add_token_scores([float(token.score) for token in vocab.tokens])
    writer.add_token_types([int(token.kind) for token in vocab.tokens])
    writer.add_token_type_count(2)
    writer.add_bos_token_id(vocab.id("<bos>"))
    writer.add_eos_token_id(vocab.id("<eos>"))
    writer.add_unk_token_id(vocab.id("<unk>"))
    writer.add_pad_token_id(vocab.id("<pad>"))
    # The rerank prompt is <bos> query <eos> document <eos> (format_prompt_rerank).
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_space_prefix(False)

    embedding = np.zeros((n_vocab, WIDTH), dtype=np.float32)
    for token in range(n_vocab):
        sign = 1.0 if token in topic else -1.0
        embedding[token, 0], embedding[token, 1] = sign, -sign
    square = np.zeros((WIDTH, WIDTH), dtype=np.float32)
    value = square.copy()
    value[2, 0] = 1.0 / _scale()  # numpy row = output dimension, column = input
    out_proj = square.copy()
    out_proj[2, 2] = 1.0
    head = np.zeros((1, WIDTH), dtype=np.float32)
    head[0, 2] = 0.5

    _tensor(writer, "token_embd.weight", embedding, f16)
    _tensor(writer, "position_embd.weight", np.zeros((CONTEXT_LENGTH, WIDTH)), f16)
    _tensor(writer, "token_embd_norm.weight", np.ones(WIDTH))
    _tensor(writer, "token_embd_norm.bias", np.zeros(WIDTH))
    for name, matrix in (("attn_q", square), ("attn_k", square), ("attn_v", value)):
        _tensor(writer, f"blk.0.{name}.weight", matrix, f16)
    _tensor(writer, "blk.0.attn_output.weight", out_proj, f16)
    for norm in ("attn_output_norm", "layer_output_norm"):
        _tensor(writer, f"blk.0.{norm}.weight", np.ones(WIDTH))
        _tensor(writer, f"blk.0.{norm}.bias", np.zeros(WIDTH))
    _tensor(writer, "blk.0.ffn_up.weight", np.zeros((FFN_WIDTH, WIDTH)), f16)
    _tensor(writer, "blk.0.ffn_down.weight", np.zeros((WIDTH, FFN_WIDTH)), f16)
    _tensor(writer, "cls.output.weight", head, f16)
    _tensor(writer, "cls.output.bias", np.full(1, 0.5))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
