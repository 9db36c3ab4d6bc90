"""The drill language: a vocabulary plus a table token -> {successor: probability}.

A drill model is a first-order Markov chain over tokens. The compiler (`compiler.py`) turns
it into a 1-layer `llama` GGUF whose next-token distribution depends only on the last token,
so what the model writes can be designed exactly: at temperature 0 it follows the most
probable successor of each token, at temperature > 0 it samples the designed probabilities.

Two rules shape every design:

* A token has one successor distribution, so a text that needs the same string in two
  places with different continuations must use two distinct tokens (`Design.chunks` splits
  a text into pieces that are unique in the vocabulary).
* Token texts are unique (llama.cpp asserts it), and SPM stores spaces as U+2581.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SPACE = "\u2581"  # SPM's visible space


class TokenKind(enum.IntEnum):
    """llama.cpp token types as stored in `tokenizer.ggml.token_type`."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Gemma 4's special tokens that the official chat template and the server's peg-gemma4
# parser know. `<|"|>` is the string delimiter inside tool calls: it must render in the
# output text, so it is user-defined (type 4); a control token would be dropped.
GEMMA4_CONTROL_TOKENS = (
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)
GEMMA4_USER_DEFINED_TOKENS = ('<|"|>',)


class DesignError(ValueError):
    """The drill design is inconsistent (duplicate token, bad probabilities...)."""


@dataclass(frozen=True)
class Token:
    """One vocabulary entry."""

    text: str
    kind: TokenKind
    score: float = 0.0


def to_spm(text: str) -> str:
    """Text as stored in an SPM vocabulary (spaces as U+2581)."""
    return text.replace(" ", SPACE)


def from_spm(piece: str) -> str:
    """Inverse of `to_spm`: how llama.cpp renders a normal token."""
    return piece.replace(SPACE, " ")


@dataclass
class Vocabulary:
    """An SPM vocabulary: <unk>, <bos>, <eos>, <pad>, special tokens, 256 byte tokens, words."""

    tokens: list[Token] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    @classmethod
    def gemma4(cls) -> Vocabulary:
        """The base vocabulary every Gemma 4 drill shares."""
        vocab = cls()
        vocab.add("<unk>", TokenKind.UNKNOWN)
        vocab.add("<bos>", TokenKind.CONTROL)
        vocab.add("<eos>", TokenKind.CONTROL)
        vocab.add("<pad>", TokenKind.CONTROL)
        for text in GEMMA4_CONTROL_TOKENS:
            vocab.add(text, TokenKind.CONTROL)
        for text in GEMMA4_USER_DEFINED_TOKENS:
            vocab.add(text, TokenKind.USER_DEFINED)
        for byte in range(256):
            vocab.add(f"<0x{byte:02X}>", TokenKind.BYTE)
        return vocab

    def add(self, text: str, kind: TokenKind = TokenKind.NORMAL, score: float = 0.0) -> int:
        """Add a token (text in SPM form for normal tokens) and return its id."""
        if not text:
            raise DesignError("empty token text")
        if text in self.index:
            raise DesignError(f"token {text!r} already in the vocabulary")
        self.tokens.append(Token(text, kind, score))
        self.index[text] = len(self.tokens) - 1
        return len(self.tokens) - 1

    def id(self, text: str) -> int:
        """Id of a token by its stored text."""
        try:
            return self.index[text]
        except KeyError:
            raise DesignError(f"no token {text!r}") from None

    def byte(self, value: int) -> int:
        """Id of the byte-fallback token <0xXX>."""
        return self.id(f"<0x{value:02X}>")

    def __len__(self) -> int:
        return len(self.tokens)

    def render(self, token_id: int, special: bool = True) -> str:
        """The text llama.cpp emits for a token (control tokens only when `special`)."""
        token = self.tokens[token_id]
        if token.kind == TokenKind.NORMAL:
            return from_spm(token.text)
        if token.kind == TokenKind.BYTE:
            return chr(int(token.text[3:5], 16))
        if token.kind == TokenKind.USER_DEFINED:
            return token.text
        return token.text if special else ""


@dataclass
class Design:
    """A vocabulary and its transition table; the input of the compiler."""

    name: str
    vocab: Vocabulary
    transitions: dict[int, dict[int, float]] = field(default_factory=dict)
    # Where a token without designed successors goes (any state the design did not foresee).
    fallback: str = "<eos>"

    def set(self, token: int, successors: Mapping[int, float]) -> None:
        """Define the successor distribution of `token` (probabilities sum to 1)."""
        total = sum(successors.values())
        if not successors or any(p <= 0 for p in successors.values()):
            raise DesignError(f"token {token}: probabilities must be positive")
        if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-9):
            raise DesignError(f"token {token}: probabilities sum to {total}, not 1")
        for successor in successors:
            if not 0 <= successor < len(self.vocab):
                raise DesignError(f"token {token}: successor {successor} not in the vocabulary")
        if token in self.transitions:
            raise DesignError(
                f"token {self.vocab.tokens[token].text!r} already has successors "
                "(a token has exactly one successor distribution: use distinct tokens)"
            )
        self.transitions[token] = dict(successors)

    def link(self, sequence: Iterable[int]) -> None:
        """Each token of `sequence` is followed by the next with probability 1."""
        ids = list(sequence)
        for current, successor in zip(ids, ids[1:], strict=False):
            self.set(current, {successor: 1.0})

    def words(self, pieces: Iterable[str]) -> list[int]:
        """Add normal tokens for plain-text pieces (spaces become U+2581); return their ids."""
        return [self.vocab.add(to_spm(piece)) for piece in pieces]

    def chunks(self, text: str, target_chars: float) -> list[str]:
        """Split `text` into pieces of about `target_chars` that are new to the vocabulary.

        A fractional target alternates piece sizes (3.5 -> 3, 4, 3, 4, ...); a piece that
        is already taken grows until it is unique.

        Pieces never end with a newline and never are a bare newline, so a prompt that ends
        in a newline still tokenizes its last character as the byte token <0x0A>.
        """
        pieces: list[str] = []
        taken = set(self.vocab.index)
        position = 0
        while position < len(text):
            wanted = round((len(pieces) + 1) * target_chars) - round(len(pieces) * target_chars)
            size = max(1, min(wanted, len(text) - position))
            while True:
                piece = text[position : position + size]
                end = position + size
                stored = to_spm(piece)
                bad_edge = piece.endswith("\n") and end < len(text)
                if stored not in taken and not bad_edge and piece != "\n":
                    break
                if end >= len(text):
                    # The tail is not unique: grow the previous piece instead.
                    if not pieces:
                        raise DesignError(f"cannot split {text!r} into unique tokens")
                    previous = pieces.pop()
                    taken.discard(to_spm(previous))
                    position -= len(previous)
                    size = len(previous) + size
                    continue
                size += 1
            pieces.append(piece)
            taken.add(stored)
            position += size
        return pieces

    def text_of(self, ids: Iterable[int], special: bool = True) -> str:
        """Rendered text of a token sequence."""
        return "".join(self.vocab.render(token_id, special) for token_id in ids)

    def greedy_path(self, start: int, steps: int) -> list[int]:
        """Tokens generated at temperature 0 after `start` (stops at a token without successors)."""
        path: list[int] = []
        current = start
        for _ in range(steps):
            successors = self.transitions.get(current)
            if not successors:
                break
            current = max(successors.items(), key=lambda item: (item[1], -item[0]))[0]
            path.append(current)
        return path

    def validate(self) -> None:
        """Check every designed successor is itself designed or a stop token."""
        if self.fallback not in self.vocab.index:
            raise DesignError(f"fallback token {self.fallback!r} not in the vocabulary")
        for token, successors in self.transitions.items():
            for successor in successors:
                kind = self.vocab.tokens[successor].kind
                if successor not in self.transitions and kind != TokenKind.CONTROL:
                    raise DesignError(
                        f"{self.vocab.tokens[token].text!r} -> "
                        f"{self.vocab.tokens[successor].text!r}: dead end (no successors)"
                    )


def sampled_probability(probability: float, temperature: float) -> float:
    """Probability of a two-way branch (p vs 1-p) after llama.cpp's temperature scaling."""
    if temperature <= 0:
        return 0.0 if probability < 0.5 else 1.0
    a = float(probability) ** (1.0 / temperature)
    b = (1.0 - float(probability)) ** (1.0 / temperature)
    return float(a / (a + b))
