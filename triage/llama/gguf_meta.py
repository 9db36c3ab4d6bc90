"""GGUF metadata that matters for triage: architecture, chat template, quantization, vocab.

Two weights files that differ in their chat template (and so in their thinking default) are
a confounder for "the quantization changed the behaviour"; this module gives the engine the
facts to tell them apart.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gguf

from kb.jsontypes import JsonObject


class GGUFMetaError(ValueError):
    """The file is missing or is not a readable GGUF file."""


@dataclass(frozen=True)
class GGUFMeta:
    """Selected GGUF metadata of one weights file."""

    path: str
    architecture: str | None
    name: str | None
    chat_template: str | None
    chat_template_sha256: str | None
    file_type: int | None
    quantization: str | None
    tensor_types: dict[str, int] = field(default_factory=dict)
    vocab_size: int | None = None
    context_length: int | None = None
    block_count: int | None = None
    embedding_length: int | None = None
    tokenizer_model: str | None = None
    size_bytes: int = 0

    @property
    def is_gemma4_template(self) -> bool:
        """The server's Gemma 4 detection: the template writes '<|tool_call>call:'."""
        return bool(self.chat_template) and "'<|tool_call>call:'" in (self.chat_template or "")

    @property
    def template_has_thinking_switch(self) -> bool:
        """The template reads `enable_thinking` (so the thinking default matters)."""
        return "enable_thinking" in (self.chat_template or "")

    def to_dict(self, *, with_template: bool = False) -> JsonObject:
        """JSON-ready dict (the template text itself only on request: it is long)."""
        data = asdict(self)
        if not with_template:
            data.pop("chat_template")
        data["is_gemma4_template"] = self.is_gemma4_template
        data["template_has_thinking_switch"] = self.template_has_thinking_switch
        return data


def _value(reader: gguf.GGUFReader, key: str) -> Any:
    field_ = reader.fields.get(key)
    if field_ is None:
        return None
    try:
        return field_.contents()
    except (IndexError, ValueError):
        return None


def quantization_name(file_type: int | None, tensor_types: Counter[str]) -> str | None:
    """Human name of the quantization: from general.file_type, else the dominant 2-D type."""
    if file_type is not None:
        try:
            name = gguf.LlamaFileType(file_type).name
        except ValueError:
            name = f"FILE_TYPE_{file_type}"
        for prefix in ("MOSTLY_", "ALL_"):
            name = name.removeprefix(prefix)
        return name
    if tensor_types:
        return tensor_types.most_common(1)[0][0]
    return None


def read_gguf_meta(path: Path | str) -> GGUFMeta:
    """Read the metadata of a GGUF file; raises GGUFMetaError on anything else."""
    path = Path(path)
    if not path.is_file():
        raise GGUFMetaError(f"no such GGUF file: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise GGUFMetaError(f"{path} is not a readable GGUF file: {exc}") from exc

    architecture = _value(reader, "general.architecture")
    template = _value(reader, "tokenizer.chat_template")
    file_type = _value(reader, "general.file_type")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens.data) if tokens is not None else None
    if vocab_size is None and architecture:
        vocab_size = _value(reader, f"{architecture}.vocab_size")
    matrix_types: Counter[str] = Counter(
        tensor.tensor_type.name for tensor in reader.tensors if len(tensor.shape) >= 2
    )
    all_types: Counter[str] = Counter(tensor.tensor_type.name for tensor in reader.tensors)

    def arch_value(suffix: str) -> Any:
        return _value(reader, f"{architecture}.{suffix}") if architecture else None

    return GGUFMeta(
        path=str(path),
        architecture=architecture,
        name=_value(reader, "general.name"),
        chat_template=template,
        chat_template_sha256=(
            hashlib.sha256(template.encode("utf-8")).hexdigest() if template else None
        ),
        file_type=int(file_type) if file_type is not None else None,
        quantization=quantization_name(
            int(file_type) if file_type is not None else None, matrix_types
        ),
        tensor_types=dict(sorted(all_types.items())),
        vocab_size=int(vocab_size) if vocab_size is not None else None,
        context_length=arch_value("context_length"),
        block_count=arch_value("block_count"),
        embedding_length=arch_value("embedding_length"),
        tokenizer_model=_value(reader, "tokenizer.ggml.model"),
        size_bytes=path.stat().st_size,
    )
