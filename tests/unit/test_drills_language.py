"""The drill language: vocabulary rules, transitions, chunking, temperature maths."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.drills.language import (
    SPACE,
    Design,
    DesignError,
    TokenKind,
    Vocabulary,
    from_spm,
    sampled_probability,
    to_spm,
)


def test_gemma4_vocabulary_layout():
    vocab = Vocabulary.gemma4()
    assert vocab.tokens[vocab.id("<unk>")].kind == TokenKind.UNKNOWN
    for name in (
        "<bos>",
        "<eos>",
        "<|turn>",
        "<turn|>",
        "<|channel>",
        "<channel|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<|think|>",
    ):
        assert vocab.tokens[vocab.id(name)].kind == TokenKind.CONTROL
    # The string delimiter must render in text: user-defined, not control.
    assert vocab.tokens[vocab.id('<|"|>')].kind == TokenKind.USER_DEFINED
    assert vocab.byte(0x0A) == vocab.id("<0x0A>")
    assert sum(token.kind == TokenKind.BYTE for token in vocab.tokens) == 256


def test_token_texts_are_unique():
    vocab = Vocabulary.gemma4()
    vocab.add("hello")
    with pytest.raises(DesignError, match="already"):
        vocab.add("hello")


def test_render_like_llama_cpp():
    vocab = Vocabulary.gemma4()
    word = vocab.add(to_spm(" the harbour"))
    assert vocab.render(word) == " the harbour"
    assert vocab.render(vocab.byte(0x0A)) == "\n"
    assert vocab.render(vocab.id('<|"|>')) == '<|"|>'
    assert vocab.render(vocab.id("<|channel>")) == "<|channel>"
    assert vocab.render(vocab.id("<|channel>"), special=False) == ""
    assert from_spm(f"a{SPACE}b") == "a b"


def test_one_successor_distribution_per_token():
    design = Design("d", Vocabulary.gemma4())
    a, b, c = design.words(["a1", "b1", "c1"])
    design.set(a, {b: 0.75, c: 0.25})
    with pytest.raises(DesignError, match="exactly one successor distribution"):
        design.set(a, {c: 1.0})
    with pytest.raises(DesignError, match="sum to"):
        design.set(b, {c: 0.5})
    with pytest.raises(DesignError, match="positive"):
        design.set(b, {c: 1.0, a: 0.0})


def test_validate_finds_dead_ends():
    design = Design("d", Vocabulary.gemma4())
    a, b = design.words(["a1", "b1"])
    design.link([a, b])
    with pytest.raises(DesignError, match="dead end"):
        design.validate()
    design.set(b, {design.vocab.id("<turn|>"): 1.0})
    design.validate()


def test_greedy_path_takes_the_most_probable_branch():
    design = Design("d", Vocabulary.gemma4())
    a, b, c = design.words(["a1", "b1", "c1"])
    design.set(a, {b: 0.85, c: 0.15})
    design.set(b, {a: 1.0})
    assert design.greedy_path(a, 5) == [b, a, b, a, b]


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="ab .,\n", min_size=1, max_size=120).filter(
        lambda t: not t.endswith("\n")
    ),
    target=st.sampled_from([1, 2, 3.5, 7]),
)
def test_chunks_are_unique_cover_the_text_and_avoid_trailing_newlines(text, target):
    design = Design("d", Vocabulary.gemma4())
    try:
        pieces = design.chunks(text, target)
    except DesignError:
        return  # e.g. "aaaa" cannot be cut into unique pieces with a tail left over
    assert "".join(pieces) == text
    stored = [to_spm(piece) for piece in pieces]
    assert len(set(stored)) == len(stored)
    assert all(not piece.endswith("\n") for piece in pieces)
    design.words(pieces)  # all addable to the vocabulary


def test_chunks_alternate_fractional_sizes():
    design = Design("d", Vocabulary.gemma4())
    pieces = design.chunks("abcdefghijklmnopqrstu", 3.5)
    assert {len(piece) for piece in pieces} == {3, 4}
    assert len(pieces) == 6  # 21 characters at 3.5 per piece


def test_sampled_probability_follows_temperature():
    assert sampled_probability(0.15, 1.0) == pytest.approx(0.15)
    assert sampled_probability(0.15, 0.0) == 0.0
    assert sampled_probability(0.15, 0.8) < 0.15
    assert sampled_probability(0.15, 2.0) > 0.15
    a, b = 0.15 ** (1 / 0.8), 0.85 ** (1 / 0.8)
    assert math.isclose(sampled_probability(0.15, 0.8), a / (a + b))
