"""A bounded reader of a GGUF file's key-value metadata only (no tensors).

`gguf.GGUFReader` parses every tensor and wraps every vocabulary entry in numpy views: on a
262k-token vocabulary that takes seconds (17 s measured on a loaded 2-core host for Gemma 3
270M). The model-file lint needs only the header's keys -- names, the chat template, the
special token ids and the token texts and types -- so this reads the KV section with
`struct` and stops before the tensor infos. Every count and length is bounded; anything
else raises GGUFKVError naming the file and the key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUFKV", "GGUFKVError", "read_kv"]

MAGIC = b"GGUF"
MAX_KV = 100_000
MAX_STRING = 64 * 1024 * 1024  # a chat template is a few KB; a token a few bytes
MAX_ARRAY = 16 * 1024 * 1024  # elements (vocabularies are < 1M tokens)

# GGUF value types -> struct format of one scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS.update({11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9

Scalar = int | float | bool | str
Value = Scalar | list[Scalar]


class GGUFKVError(ValueError):
    """The file is missing, not GGUF, or its metadata is malformed or out of bounds."""


@dataclass(frozen=True)
class GGUFKV:
    """The metadata keys of one GGUF file (arrays as lists)."""

    path: str
    version: int
    values: dict[str, Value] = field(default_factory=dict)

    def text(self, key: str) -> str | None:
        value = self.values.get(key)
        return value if isinstance(value, str) else None

    def integer(self, key: str) -> int | None:
        value = self.values.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def strings(self, key: str) -> list[str]:
        value = self.values.get(key)
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    def integers(self, key: str) -> list[int]:
        value = self.values.get(key)
        if not isinstance(value, list):
            return []
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]


class _Reader:
    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self.handle = handle
        self.path = path
        self.key = "header"

    def _fail(self, why: str) -> GGUFKVError:
        return GGUFKVError(f"{self.path}: GGUF metadata {self.key!r}: {why}")

    def raw(self, size: int) -> bytes:
        data = self.handle.read(size)
        if len(data) != size:
            raise self._fail("the file ends inside it")
        return data

    def scalar(self, fmt: str) -> Scalar:
        value: Scalar = struct.unpack(fmt, self.raw(struct.calcsize(fmt)))[0]
        return value

    def count(self, limit: int, what: str) -> int:
        value = int(self.scalar("<Q"))
        if value > limit:
            raise self._fail(f"{what} {value} exceeds the bound {limit}")
        return value

    def string(self) -> str:
        return self.raw(self.count(MAX_STRING, "string length")).decode("utf-8", "replace")

    def value(self, kind: int) -> Value:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner = int(self.scalar("<I"))
            size = self.count(MAX_ARRAY, "array length")
            if inner == _STRING:
                return [self.string() for _ in range(size)]
            fmt = _SCALARS.get(inner)
            if fmt is None:
                raise self._fail(f"array of unsupported type {inner}")
            width = struct.calcsize(fmt)
            data = self.raw(width * size)
            return list(struct.unpack(f"<{size}{fmt[1]}", data))
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise self._fail(f"unsupported value type {kind}")
        return self.scalar(fmt)


def read_kv(path: Path | str) -> GGUFKV:
    """Every metadata key of the GGUF file at `path` (GGUFKVError on anything else)."""
    path = Path(path)
    if not path.is_file():
        raise GGUFKVError(f"no such GGUF file: {path}")
    try:
        with path.open("rb") as handle:
            reader = _Reader(handle, path)
            if reader.raw(4) != MAGIC:
                raise GGUFKVError(f"{path} is not a GGUF file (no GGUF magic)")
            version = int(reader.scalar("<I"))
            if version < 2:
                raise GGUFKVError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            reader.count(1 << 32, "tensor count")
            kv_count = reader.count(MAX_KV, "key count")
            values: dict[str, Value] = {}
            for index in range(kv_count):
                reader.key = f"key #{index}"
                key = reader.string()
                reader.key = key
                values[key] = reader.value(int(reader.scalar("<I")))
    except OSError as exc:
        raise GGUFKVError(f"{path}: cannot read: {exc}") from None
    return GGUFKV(str(path), version, values)
