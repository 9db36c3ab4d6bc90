"""The evidence sidecar of an incident file: replay-level evidence beside `<slug>.md`.

A diagnosed incident holds hundreds of replies (evidence kind `probe`, one per replay);
in the front matter they made a 1.78 MB file nobody reads. Export writes them to
`<slug>.evidence.jsonl` (one evidence entry per line, in record order), gzip-compressed as
`<slug>.evidence.jsonl.gz` when the text is large; the front matter keeps the record
(incident, causes, decisions, references, and the evidence that is not a replay). Import
reads the sidecar next to the file and validates its entries like front-matter evidence.

Both forms are deterministic (compact JSON with keys in record order; gzip with no name
and mtime 0), so export -> import -> export is byte-identical.
"""

from __future__ import annotations

import gzip
import heapq
import io
import json
import re
from pathlib import Path
from typing import Any

from kb.jsontypes import JsonObject
from kb.repo.fileio import InputTooLarge, read_bounded

__all__ = [
    "GZIP_FROM_BYTES",
    "SIDECAR_KINDS",
    "SidecarError",
    "decode_sidecar",
    "encode_sidecar",
    "merge_evidence",
    "read_sidecar",
    "sidecar_paths",
    "split_evidence",
]

# Evidence kinds that live in the sidecar: one entry per replay.
SIDECAR_KINDS = ("probe",)
GZIP_FROM_BYTES = 256 * 1024
MAX_SIDECAR_BYTES = 64 * 1024 * 1024  # on disk, and again after decompression
MAX_JSON_DEPTH = 100
PLAIN, GZIPPED = ".evidence.jsonl", ".evidence.jsonl.gz"


class SidecarError(Exception):
    """A sidecar import refuses: which file, which line, what is wrong."""

    def __init__(self, file: Path | str, where: str, message: str) -> None:
        super().__init__(f"{file}: {where}: {message}")
        self.file, self.where, self.message = str(file), where, message


def sidecar_paths(md_path: Path) -> tuple[Path, Path]:
    """(plain, gzipped) sidecar paths of an incident file."""
    stem = md_path.name.removesuffix(".md")
    return md_path.with_name(stem + PLAIN), md_path.with_name(stem + GZIPPED)


def split_evidence(
    evidence: list[JsonObject],
) -> tuple[list[JsonObject], list[JsonObject]]:
    """(front-matter evidence, sidecar evidence), each in record order."""
    front = [item for item in evidence if item.get("kind") not in SIDECAR_KINDS]
    side = [item for item in evidence if item.get("kind") in SIDECAR_KINDS]
    return front, side


def _key_order(item: JsonObject) -> tuple[str, int, str]:
    match = re.match(r"^([A-Za-z]*)(\d+)(.*)$", str(item.get("id", "")))
    if match:
        return (match.group(1), int(match.group(2)), match.group(3))
    return (str(item.get("id", "")), -1, "")


def merge_evidence(front: list[JsonObject], side: list[JsonObject]) -> list[JsonObject]:
    """The record's evidence from its two halves: each half keeps its order, interleaved by
    evidence number -- the order the store numbered them in, so a re-import stores the
    rows in the original order and the next export is byte-identical."""
    return list(heapq.merge(front, side, key=_key_order))


def encode_sidecar(items: list[JsonObject]) -> tuple[str, bytes]:
    """(suffix, bytes) of a sidecar holding `items`: plain JSONL, or gzip when large."""
    text = "".join(
        json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
        for item in items
    ).encode("utf-8")
    if len(text) < GZIP_FROM_BYTES:
        return PLAIN, text
    return GZIPPED, gzip.compress(text, compresslevel=9, mtime=0)


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def decode_sidecar(raw: bytes, file: Path | str, gzipped: bool) -> list[JsonObject]:
    """The evidence entries of a sidecar's bytes; errors name the file and the line."""
    if gzipped:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as handle:
                raw = handle.read(MAX_SIDECAR_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise SidecarError(file, "$", f"not a gzip file: {exc}") from None
        if len(raw) > MAX_SIDECAR_BYTES:
            raise SidecarError(file, "$", f"decompresses to more than {MAX_SIDECAR_BYTES} bytes")
    items: list[JsonObject] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
        except UnicodeDecodeError as exc:
            raise SidecarError(file, f"line {number}", f"not UTF-8 (byte {exc.start})") from None
        except RecursionError:
            raise SidecarError(file, f"line {number}", "nested too deeply") from None
        except ValueError as exc:
            raise SidecarError(file, f"line {number}", f"not JSON: {exc}") from None
        if not isinstance(item, dict):
            raise SidecarError(file, f"line {number}", "each line must be a JSON object")
        if not _depth_ok(item):
            raise SidecarError(
                file, f"line {number}", f"nested deeper than {MAX_JSON_DEPTH} levels"
            )
        items.append(item)
    return items


def read_sidecar(md_path: Path) -> tuple[Path | None, list[JsonObject]]:
    """(sidecar path, its evidence entries) of an incident file; (None, []) without one."""
    existing = [path for path in sidecar_paths(md_path) if path.exists()]
    if not existing:
        return None, []
    if len(existing) == 2:
        raise SidecarError(
            existing[1], "$", f"both {existing[0].name} and {existing[1].name} exist; keep one"
        )
    path = existing[0]
    try:
        raw = read_bounded(path, MAX_SIDECAR_BYTES)
    except InputTooLarge as exc:
        raise SidecarError(path, "$", f"cannot read the file: {exc}") from None
    except OSError as exc:
        raise SidecarError(path, "$", f"cannot read the file: {exc.strerror}") from None
    return path, decode_sidecar(raw, path, path.name.endswith(".gz"))
