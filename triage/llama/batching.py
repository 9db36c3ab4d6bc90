"""llama-server's physical batch as it limits embeddings and rerank inputs (b11434, measured).

An embeddings or rerank input is encoded in one physical batch: the server cannot split it.
An input of more tokens than the batch is refused with HTTP 500 "input (N tokens) is too
large to process. increase the physical batch size (current batch size: M)". M is `-ub`
(default 512) capped by `-b` (default 2048) and by the context `-c` (measured: `-c 2048
-ub 4096 -b 4096` answers "current batch size: 2048"); an input that fits the batch but not
the slot's context (`-c / -np`) is refused with HTTP 400 exceed_context_size_error instead.

Pure: server args in, sizes and args out; request bodies in, split bodies out.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from kb.jsontypes import JsonObject
from triage.llama.endpoints import Endpoint, endpoint_of, input_texts, rerank_documents_key

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_UBATCH",
    "MAX_TOKENS_PER_BYTE",
    "SPECIAL_TOKENS",
    "flag_value",
    "physical_batch",
    "raised_args",
    "split_request",
    "split_text",
    "token_bound",
]

DEFAULT_UBATCH = 512  # llama-server's -ub default
DEFAULT_BATCH = 2048  # its -b default
UBATCH_FLAGS = ("-ub", "--ubatch-size")
BATCH_FLAGS = ("-b", "--batch-size")
CTX_FLAGS = ("-c", "--ctx-size")
# Tokens a tokenizer adds around an input (BOS/EOS, CLS/SEP; a rerank pair's separators).
SPECIAL_TOKENS = 8
# At most this many tokens per UTF-8 byte: a byte-level BPE or WordPiece gives at most one,
# a SentencePiece model with byte fallback three for a space whose U+2581 marker it lacks.
MAX_TOKENS_PER_BYTE = 3


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last `-x V` / `--xx=V` among `args` for any of `names`."""
    found = None
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                found = args[index + 1]
            elif name.startswith("--") and arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _int(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def physical_batch(args: Sequence[str]) -> int:
    """The largest input (tokens) these args let llama-server encode: -ub, capped by -b and
    by an explicit -c."""
    ubatch = _int(flag_value(args, UBATCH_FLAGS)) or DEFAULT_UBATCH
    batch = _int(flag_value(args, BATCH_FLAGS)) or DEFAULT_BATCH
    ctx = _int(flag_value(args, CTX_FLAGS))
    return min(ubatch, batch, ctx) if ctx else min(ubatch, batch)


def without_flags(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """`args` without any `-x V` / `--xx=V` of `names`."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(n.startswith("--") and arg.startswith(n + "=") for n in names):
            continue
        out.append(arg)
    return out


def raised_args(args: Sequence[str], size: int, context: int | None) -> list[str]:
    """`args` with `-ub`/`-b` set to `size` and, when given, `-c` set to `context`."""
    out = without_flags(args, (*UBATCH_FLAGS, *BATCH_FLAGS))
    if context is not None:
        out = without_flags(out, CTX_FLAGS) + ["-c", str(context)]
    return [*out, "-ub", str(size), "-b", str(size)]


def token_bound(item: str | list[int]) -> int:
    """An upper bound on the tokens of one input, specials included."""
    if isinstance(item, list):
        return len(item) + SPECIAL_TOKENS
    return MAX_TOKENS_PER_BYTE * len(item.encode("utf-8")) + SPECIAL_TOKENS


def split_text(text: str, max_bytes: int) -> list[str]:
    """`text` in pieces of at most `max_bytes` UTF-8 bytes, cut at whitespace where a word
    fits, else inside the word (never inside a character)."""
    max_bytes = max(4, max_bytes)
    pieces: list[str] = []
    current = ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if len(candidate.encode("utf-8")) <= max_bytes:
            current = candidate
            continue
        if current:
            pieces.append(current)
        current = ""
        while len(word.encode("utf-8")) > max_bytes:
            cut = max_bytes
            while len(word[:cut].encode("utf-8")) > max_bytes:
                cut -= 1
            pieces.append(word[:cut])
            word = word[cut:]
        current = word
    if current or not pieces:
        pieces.append(current)
    return pieces


def _pieces(item: str | list[int], limit: int, reserved: int) -> list[Any]:
    room = max(1, limit - SPECIAL_TOKENS - reserved)
    if isinstance(item, list):
        return [item[i : i + room] for i in range(0, len(item), room)]
    return list(split_text(item, room // MAX_TOKENS_PER_BYTE))


def split_request(body: JsonObject, limit: int) -> JsonObject:
    """The request with every input cut into pieces that fit a physical batch of `limit`
    tokens whatever the tokenizer (token_bound): an embeddings `input` becomes the list of
    the pieces in order; a rerank request's documents are cut so query + piece fit."""
    out = copy.deepcopy(body)
    endpoint = endpoint_of(body)
    if endpoint is Endpoint.RERANK:
        query = body.get("query")
        reserved = token_bound(query) if isinstance(query, str) else 0
        key = rerank_documents_key(body) or "documents"  # `texts` in the TEI form
        out[key] = [p for d in input_texts(body) for p in _pieces(d, limit, reserved)]
    elif endpoint is Endpoint.EMBEDDINGS:
        out["input"] = [p for item in input_texts(body) for p in _pieces(item, limit, 0)]
    return out


def needs_split(body: JsonObject, limit: int) -> bool:
    """Could an input of this request exceed a physical batch of `limit` tokens?"""
    endpoint = endpoint_of(body)
    reserved = 0
    if endpoint is Endpoint.RERANK and isinstance(body.get("query"), str):
        reserved = token_bound(body["query"])
    return any(token_bound(item) + reserved > limit for item in input_texts(body))


def splittable(body: JsonObject, limit: int) -> bool:
    """Can every input be cut to fit `limit` (a rerank query alone must fit)?"""
    if endpoint_of(body) is Endpoint.RERANK and isinstance(body.get("query"), str):
        return token_bound(body["query"]) + 2 * SPECIAL_TOKENS < limit
    return limit > SPECIAL_TOKENS + MAX_TOKENS_PER_BYTE
