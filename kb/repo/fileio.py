"""Bounded YAML, bounded reads and exclusive atomic writes for the knowledge base's files.

Incident files come from anywhere (a colleague's branch, an attachment), so reading one
must stay bounded in memory and time whatever it holds:

- YAML: safe loading only, with limits on nesting depth, on the number of aliases and on
  the nodes aliases add (a "billion laughs" bomb is refused while it is being composed,
  before anything is expanded), and a recursive alias (`&s {self: *s}`) is refused;
- files: read up to a byte limit (never trusting `st_size`), regular files only (a FIFO
  would block, a device would never end).

Writes go through a temporary file created exclusively (O_EXCL, random name) in the target
folder and renamed over the target, so a pre-planted symlink is never followed and a
reader never sees half a file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = [
    "MAX_FILE_BYTES",
    "YAML_MAX_ALIASES",
    "YAML_MAX_ALIAS_NODES",
    "YAML_MAX_DEPTH",
    "InputTooLarge",
    "dump_yaml",
    "load_yaml",
    "read_bounded",
    "write_atomic",
]

MAX_FILE_BYTES = 16 * 1024 * 1024
YAML_MAX_DEPTH = 100
YAML_MAX_ALIASES = 1_000
# Nodes that aliases add beyond those written in the text (each alias counts the full
# size of what it points to, nested aliases included).
YAML_MAX_ALIAS_NODES = 100_000
YAML_WIDTH = 100

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_STR_TAG = "tag:yaml.org,2002:str"


class InputTooLarge(OSError):
    """A file over its byte limit, or not a regular file."""


# --------------------------------------------------------------------------- reading


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes.

    Refuses FIFOs, devices and directories (checked on the opened descriptor, so a swap
    between the check and the read cannot sneak one in) and stops reading at `limit + 1`
    bytes whatever `st_size` says (it is 0 for /proc files and devices).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise InputTooLarge(f"{kind} (only regular files are read)")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputTooLarge(f"larger than the limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writing


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` through an exclusive temporary file in the same folder.

    `tempfile.mkstemp` creates the file with O_CREAT | O_EXCL under a random name, so an
    existing file or symlink (say `.<name>.tmp` pointing outside the folder) is never
    opened; `os.replace` then swaps the directory entry itself -- if `path` is a symlink,
    the link is replaced, not its target.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------- YAML


def _without_timestamps(
    resolvers: dict[Any, list[tuple[str, Any]]],
) -> dict[Any, list[tuple[str, Any]]]:
    return {
        first: [(tag, regexp) for tag, regexp in entries if tag != _TIMESTAMP_TAG]
        for first, entries in resolvers.items()
    }


class _BoundedComposer(yaml.SafeLoader):
    """SafeLoader whose composer refuses deep nesting, alias bombs and recursive aliases.

    PyYAML composes aliases as shared nodes (cheap), but everything after composition
    (construction checks, JSON Schema, the store) walks the expanded tree. So every
    composed node gets its expanded size; an alias adds the size of its target, and the
    total added by aliases is capped. An alias to a node whose composition has not ended
    is a cycle.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._sizes = {}
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            target = self.anchors.get(event.anchor) if event.anchor is not None else None
            if target is not None:
                self._count_alias(target, event)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > YAML_MAX_DEPTH:
            raise ComposerError(
                None,
                None,
                f"nesting deeper than {YAML_MAX_DEPTH} levels",
                self.peek_event().start_mark,  # type: ignore[no-untyped-call]
            )
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None:
            self._sizes[id(node)] = self._expanded_size(node)
        return node

    def _count_alias(self, target: Node, event: Any) -> None:
        size = self._sizes.get(id(target))
        if size is None:
            raise ComposerError(
                None,
                None,
                f"recursive alias *{event.anchor} (it refers to itself)",
                event.start_mark,
            )
        self._aliases += 1
        if self._aliases > YAML_MAX_ALIASES:
            raise ComposerError(
                None, None, f"more than {YAML_MAX_ALIASES} aliases", event.start_mark
            )
        self._alias_nodes += size
        if self._alias_nodes > YAML_MAX_ALIAS_NODES:
            raise ComposerError(
                None,
                None,
                f"aliases expand to more than {YAML_MAX_ALIAS_NODES} nodes (alias bomb)",
                event.start_mark,
            )

    def _expanded_size(self, node: Node) -> int:
        sizes = self._sizes
        if isinstance(node, SequenceNode):
            return 1 + sum(sizes.get(id(item), 1) for item in node.value)
        if isinstance(node, MappingNode):
            return 1 + sum(
                sizes.get(id(key), 1) + sizes.get(id(value), 1) for key, value in node.value
            )
        return 1


class _Loader(_BoundedComposer):
    """Safe loading; dates and datetimes stay strings; duplicate keys are an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: reported by the constructor below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = _without_timestamps(yaml.SafeLoader.yaml_implicit_resolvers)
# An explicit !!timestamp tag stays a string too.
_Loader.add_constructor(_TIMESTAMP_TAG, yaml.SafeLoader.construct_yaml_str)  # type: ignore[type-var]


class _Dumper(yaml.SafeDumper):
    """Canonical output: block style, indented sequences, no anchors, no timestamp quoting."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


# Without the timestamp resolver a string like 2026-06-10 is written plain; _Loader reads
# it back as the same string.
_Dumper.yaml_implicit_resolvers = _without_timestamps(yaml.SafeDumper.yaml_implicit_resolvers)

# The YAML reader folds these into "\n" (or keeps them as breaks) inside block and
# single-quoted scalars; only double quotes (with escapes) keep them exactly.
_NEEDS_DOUBLE_QUOTES = frozenset("\r\x85\u2028\u2029")


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if _NEEDS_DOUBLE_QUOTES.intersection(data):
        return dumper.represent_scalar(_STR_TAG, data, style='"')
    if "\n" in data:
        # The emitter falls back to quotes when a literal block cannot hold the text
        # (e.g. trailing spaces on a line).
        return dumper.represent_scalar(_STR_TAG, data, style="|")
    return dumper.represent_scalar(_STR_TAG, data)


_Dumper.add_representer(str, _represent_str)


def load_yaml(text: str) -> Any:
    """Parse YAML safely and bounded; dates stay strings; duplicate keys, deep nesting,
    alias bombs and recursive aliases raise yaml.YAMLError."""
    return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader subclass


def dump_yaml(data: Any) -> str:
    """Canonical YAML text of `data` (keys in the given order)."""
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=YAML_WIDTH,
    )
