"""What differs between two GGUF conversions beyond their tensors: the tokenizer metadata
real conversions get wrong (a token's type, special-token ids, BOS handling, the tokenizer
model) and the embedded chat template.

Used by the alt-weights arm's confounder observation: two files of the same quant type that
behave differently and differ here point at the conversion (`model-file`), not at the
quantization.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

# Scalar keys compared as they are.
SCALAR_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
)
MAX_TOKENS = 1_000_000  # vocabularies beyond this are not compared token by token
MAX_LISTED = 5  # differing tokens named in a report


def _value(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class _Conversion:
    """What one GGUF file says about its conversion: the scalar tokenizer keys (None when
    absent), the vocabulary with its token types (None when absent or too large to compare)
    and the chat template's hash (None without a template)."""

    scalars: dict[str, Any]  # SCALAR_KEYS -> the field's value as gguf reads it
    tokens: list[Any] | None
    token_types: list[Any]
    chat_template_sha256: str | None


def _read(path: Path) -> _Conversion:
    reader = gguf.GGUFReader(str(path))
    scalars = {key: _value(reader, key) for key in SCALAR_KEYS}
    tokens: list[Any] | None = None
    token_types: list[Any] = []
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is not None and len(field.data) <= MAX_TOKENS:
        tokens = _value(reader, "tokenizer.ggml.tokens") or []
        token_types = _value(reader, "tokenizer.ggml.token_type") or []
    template = _value(reader, "tokenizer.chat_template")
    template_hash = hashlib.sha256(str(template).encode("utf-8")).hexdigest() if template else None
    return _Conversion(scalars, tokens, token_types, template_hash)


def _token_differences(a: _Conversion, b: _Conversion) -> list[str]:
    tokens_a, tokens_b = a.tokens, b.tokens
    if tokens_a is None or tokens_b is None:
        return []
    if len(tokens_a) != len(tokens_b):
        return [f"vocabulary size {len(tokens_a)} vs {len(tokens_b)}"]
    texts = sum(1 for x, y in zip(tokens_a, tokens_b, strict=True) if x != y)
    out = [f"{texts} token texts"] if texts else []
    types_a, types_b = a.token_types, b.token_types
    changed = [
        (index, x, y)
        for index, (x, y) in enumerate(zip(types_a, types_b, strict=False))
        if int(x) != int(y)
    ]
    for index, x, y in changed[:MAX_LISTED]:
        out.append(f"token {tokens_a[index]!r} (id {index}) type {int(x)} vs {int(y)}")
    if len(changed) > MAX_LISTED:
        out.append(f"{len(changed) - MAX_LISTED} more token types")
    return out


def conversion_differences(path_a: Path | str, path_b: Path | str) -> list[str]:
    """Readable differences of tokenizer metadata and chat template between two GGUF files
    (empty when they agree); raises OSError/ValueError when a file cannot be read."""
    a, b = _read(Path(path_a)), _read(Path(path_b))
    out = [
        f"{key.removeprefix('tokenizer.ggml.')} {a.scalars[key]!r} vs {b.scalars[key]!r}"
        for key in SCALAR_KEYS
        if a.scalars[key] != b.scalars[key]
    ]
    out.extend(_token_differences(a, b))
    if a.chat_template_sha256 != b.chat_template_sha256:
        out.append("the embedded chat template")
    return out
