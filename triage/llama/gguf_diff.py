"""What differs between two GGUF conversions beyond their tensors: the tokenizer metadata
real conversions get wrong (a token's type, special-token ids, BOS handling, the tokenizer
model) and the embedded chat template.

Used by the alt-weights arm's confounder observation: two files of the same quant type that
behave differently and differ here point at the conversion (`model-file`), not at the
quantization.
"""

from __future__ import annotations

import hashlib
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


def _read(path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(path))
    data: dict[str, Any] = {key: _value(reader, key) for key in SCALAR_KEYS}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens.data) <= MAX_TOKENS:
        data["tokens"] = _value(reader, "tokenizer.ggml.tokens") or []
        data["token_types"] = _value(reader, "tokenizer.ggml.token_type") or []
    template = _value(reader, "tokenizer.chat_template")
    data["chat_template_sha256"] = (
        hashlib.sha256(str(template).encode("utf-8")).hexdigest() if template else None
    )
    return data


def _token_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    tokens_a, tokens_b = a.get("tokens"), b.get("tokens")
    if tokens_a is None or tokens_b is None:
        return []
    if len(tokens_a) != len(tokens_b):
        return [f"vocabulary size {len(tokens_a)} vs {len(tokens_b)}"]
    texts = sum(1 for x, y in zip(tokens_a, tokens_b, strict=True) if x != y)
    out = [f"{texts} token texts"] if texts else []
    types_a, types_b = a.get("token_types") or [], b.get("token_types") or []
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
        f"{key.removeprefix('tokenizer.ggml.')} {a[key]!r} vs {b[key]!r}"
        for key in SCALAR_KEYS
        if a[key] != b[key]
    ]
    out.extend(_token_differences(a, b))
    if a["chat_template_sha256"] != b["chat_template_sha256"]:
        out.append("the embedded chat template")
    return out
