"""The crafted reranker (triage.drills.reranker) and the embedding-batch-rerank drill, without
a server: the GGUF carries what llama-server b11434 needs to serve /v1/rerank (a non-causal
bert with rank pooling and a one-label classification head, BOS and EOS for the pair
prompt), each word is one token of its vocabulary, and the drill is a rerank request whose
split contrast fits the default physical batch. The real server's answers are in
tests/integration/test_drill_rerank.py."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from triage.drills import build_drill, list_drills
from triage.drills.rerank import LONG_DOCUMENT, NAME, QUERY
from triage.drills.reranker import (
    TOPIC,
    WIDTH,
    build_vocabulary,
    compile_reranker,
    reference_score,
)
from triage.llama.batching import physical_batch, token_bound
from triage.llama.endpoints import Endpoint, endpoint_of
from triage.stackfile import load_stack


def _field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.mark.parametrize("fmt", ["F32", "F16"])
def test_the_gguf_is_a_non_causal_bert_with_rank_pooling_and_a_head(
    tmp_path: Path, fmt: str
) -> None:
    path = compile_reranker(tmp_path / "r.gguf", weight_format=fmt)
    reader = gguf.GGUFReader(path)
    assert _field(reader, "general.architecture") == "bert"
    assert _field(reader, "bert.pooling_type") == 4  # LLAMA_POOLING_TYPE_RANK
    assert _field(reader, "bert.attention.causal") is False
    assert _field(reader, "tokenizer.ggml.token_type_count") == 2  # bert.cpp requires one
    # common.cpp refuses reranking without a BOS, and without an EOS/SEP to join the pair.
    assert _field(reader, "tokenizer.ggml.add_bos_token") is True
    assert _field(reader, "tokenizer.ggml.add_eos_token") is True
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["cls.output.weight"].shape) == [WIDTH, 1]  # one relevance score
    assert list(tensors["position_embd.weight"].shape) == [WIDTH, 8192]
    matrix = gguf.GGMLQuantizationType.F16 if fmt == "F16" else gguf.GGMLQuantizationType.F32
    assert tensors["blk.0.attn_v.weight"].tensor_type == matrix
    assert tensors["cls.output.bias"].tensor_type == gguf.GGMLQuantizationType.F32


def test_an_unknown_weight_format_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="weight_format"):
        compile_reranker(tmp_path / "r.gguf", weight_format="Q4_0")


def test_every_word_reaches_one_token_through_two_symbol_merges() -> None:
    vocab, topic = build_vocabulary()
    for word in TOPIC:
        for text in (word, "\u2581" + word):
            # llama.cpp's SPM merges two symbols only into a token: every prefix is one.
            assert all(text[:n] in vocab.index for n in range(2, len(text) + 1))
            assert vocab.index[text] in topic
    assert vocab.index["\u2581harbour"] not in topic and vocab.id("<bos>") not in topic


def test_the_score_rises_with_the_share_of_topic_words() -> None:
    scores = [reference_score(k, 20) for k in range(0, 20)]
    assert scores == sorted(scores) and 0.0 < scores[0] < 0.05 and 0.9 < scores[-1] < 1.0
    with pytest.raises(ValueError, match="BOS"):
        reference_score(5, 5)


def test_the_drill_is_a_rerank_request_past_the_default_batch(tmp_path: Path) -> None:
    assert NAME in list_drills()
    drill = build_drill(NAME, tmp_path)
    body = drill.request("query-and-long-document")
    assert endpoint_of(body) is Endpoint.RERANK and body["query"] == QUERY
    assert body["documents"][1] == LONG_DOCUMENT
    assert "--reranking" in drill.server_args and physical_batch(drill.server_args) == 512
    split = drill.request("split")
    assert len(split["documents"]) > 2
    assert all(token_bound(d) + token_bound(QUERY) <= 512 + 8 for d in split["documents"])
    stack = load_stack(tmp_path / "stack.toml")
    assert stack.server.model is not None and stack.server.model.name.endswith("-qat.gguf")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["causes"]["embedding-batch"]["expected"] == "confirmed"
    assert manifest["requests"][0]["endpoint"] == "/v1/rerank"
