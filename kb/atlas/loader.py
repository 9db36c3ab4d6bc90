"""Reading atlas entries (and importing a team's own): one Markdown file per public incident,
YAML front matter checked against kb/schemas/atlas-entry.schema.json.

Entry files come from this package (kb/atlas/entries/, shipped with the wheel) and from a
team's own folders (`$TRIAGE_ATLAS_PATH`, `--atlas DIR`, the folder `triage atlas import`
fills under `$TRIAGE_HOME/atlas`). Any of them may be hostile, so reading is bounded: at
most `MAX_ENTRY_BYTES` per file and `MAX_FILES_PER_DIR` files per folder, YAML through the
knowledge base's bounded safe loader (kb/fileio.py: no tags, alias bombs and deep nesting
refused), and every problem is an `AtlasError` naming the file and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kb.jsontypes import JsonObject
from kb.repo.engine import data_dir
from kb.repo.fileio import InputTooLarge, load_yaml, read_bounded, write_atomic

__all__ = [
    "ATLAS_PATH_ENV",
    "MAX_ENTRY_BYTES",
    "MAX_FILES_PER_DIR",
    "SCHEMA_PATH",
    "SHIPPED_DIR",
    "AtlasEntry",
    "AtlasError",
    "BuildRange",
    "ImportResult",
    "Signatures",
    "atlas_dirs",
    "entry_files",
    "import_atlas",
    "load_atlas",
    "load_entry",
    "parse_entry",
    "team_dir",
]

SHIPPED_DIR = Path(__file__).resolve().parent / "entries"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "atlas-entry.schema.json"
ATLAS_PATH_ENV = "TRIAGE_ATLAS_PATH"
# An entry is a page of front matter and a short body; anything larger is not one.
MAX_ENTRY_BYTES = 64 * 1024
MAX_FILES_PER_DIR = 5000
SUFFIX = ".md"
# Files in an atlas folder that are about the folder, not entries.
NOT_ENTRIES = frozenset({"README.md", "readme.md", "INDEX.md", "index.md"})
_FENCE = re.compile(r"^---[ \t]*$", re.MULTILINE)


class AtlasError(ValueError):
    """An atlas file or folder refused: which file, which field, what is wrong."""

    def __init__(self, file: str | os.PathLike[str], json_path: str, message: str) -> None:
        self.file = str(file)
        self.json_path = json_path
        self.message = message
        super().__init__(f"{self.file}: {json_path}: {message}")


@dataclass(frozen=True)
class Signatures:
    """The facts a match needs (every list may be empty, not all of them)."""

    finding_kinds: tuple[str, ...] = ()
    http_status: tuple[int, ...] = ()
    error_strings: tuple[str, ...] = ()
    log_strings: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildRange:
    """llama.cpp build numbers where known: affected from/to (inclusive) and first fixed."""

    affected_from: int | None = None
    affected_to: int | None = None
    fixed_in: int | None = None

    def describe(self) -> str:
        parts = []
        if self.affected_from or self.affected_to:
            low = f"b{self.affected_from}" if self.affected_from else "?"
            high = f"b{self.affected_to}" if self.affected_to else "?"
            parts.append(f"affected {low}..{high}")
        if self.fixed_in:
            parts.append(f"fixed in b{self.fixed_in}")
        return ", ".join(parts) or "builds unknown"


@dataclass(frozen=True)
class AtlasEntry:
    """One public incident of the atlas (front matter of one file, plus its body)."""

    id: str
    title: str
    project: str
    source: str
    cause: str
    signatures: Signatures
    builds: BuildRange = field(default_factory=BuildRange)
    related: tuple[str, ...] = ()
    reported: str | None = None
    identified_by: str | None = None
    cause_text: str | None = None
    models: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    cpu_flags: tuple[str, ...] = ()
    server_flags: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()
    fix: str | None = None
    workaround: str | None = None
    body: str = ""
    file: str = ""

    def to_dict(self) -> JsonObject:
        """The JSON form (`triage atlas show --json`): the front matter fields, body, file."""
        return {
            "id": self.id,
            "title": self.title,
            "project": self.project,
            "source": self.source,
            "related": list(self.related),
            "reported": self.reported,
            "identified_by": self.identified_by,
            "cause": self.cause,
            "cause_text": self.cause_text,
            "signatures": {
                "finding_kinds": list(self.signatures.finding_kinds),
                "http_status": list(self.signatures.http_status),
                "error_strings": list(self.signatures.error_strings),
                "log_strings": list(self.signatures.log_strings),
            },
            "builds": {
                "affected_from": self.builds.affected_from,
                "affected_to": self.builds.affected_to,
                "fixed_in": self.builds.fixed_in,
            },
            "models": list(self.models),
            "backends": list(self.backends),
            "cpu_flags": list(self.cpu_flags),
            "server_flags": list(self.server_flags),
            "clients": list(self.clients),
            "fix": self.fix,
            "workaround": self.workaround,
            "body": self.body,
            "file": self.file,
        }


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)  # once per process: a broken schema is a bug
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value or ())


def _split(text: str, file: str) -> tuple[str, str]:
    """(front matter YAML, Markdown body)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    if not text.startswith("---\n"):
        raise AtlasError(file, "$", "the file must start with a '---' line (YAML front matter)")
    closing = _FENCE.search(text, 4)
    if closing is None:
        raise AtlasError(file, "$", "the front matter has no closing '---' line")
    return text[4 : closing.start()], text[closing.end() :].lstrip("\n")


def parse_entry(text: str, file: str = "<text>") -> AtlasEntry:
    """Parse and schema-check one entry's text; raises AtlasError naming file and field."""
    front, body = _split(text, file)
    try:
        data = load_yaml(front)
    except RecursionError:  # a backstop: the loader limits nesting well below this
        raise AtlasError(file, "$", "invalid YAML front matter: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise AtlasError(file, "$", f"invalid YAML front matter{where}: {problem}") from None
    if not isinstance(data, dict):
        raise AtlasError(file, "$", "the front matter must be a YAML mapping")
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        raise AtlasError(file, error.json_path, _short(error.message))
    stem = Path(file).name.removesuffix(SUFFIX)
    if file != "<text>" and stem != data["id"]:
        raise AtlasError(file, "$.id", f"id {data['id']!r} must equal the file name {stem!r}")
    signatures = data["signatures"]
    builds = data.get("builds") or {}
    return AtlasEntry(
        id=data["id"],
        title=data["title"],
        project=data["project"],
        source=data["source"],
        cause=data["cause"],
        signatures=Signatures(
            finding_kinds=_strings(signatures.get("finding_kinds")),
            http_status=tuple(int(s) for s in signatures.get("http_status") or ()),
            error_strings=_strings(signatures.get("error_strings")),
            log_strings=_strings(signatures.get("log_strings")),
        ),
        builds=BuildRange(
            affected_from=builds.get("affected_from"),
            affected_to=builds.get("affected_to"),
            fixed_in=builds.get("fixed_in"),
        ),
        related=_strings(data.get("related")),
        reported=data.get("reported"),
        identified_by=data.get("identified_by"),
        cause_text=data.get("cause_text"),
        models=_strings(data.get("models")),
        backends=_strings(data.get("backends")),
        cpu_flags=_strings(data.get("cpu_flags")),
        server_flags=_strings(data.get("server_flags")),
        clients=_strings(data.get("clients")),
        fix=data.get("fix"),
        workaround=data.get("workaround"),
        body=body.strip(),
        file=file,
    )


def _short(message: str, limit: int = 240) -> str:
    """A schema message without the whole offending value (it may be a huge string)."""
    return message if len(message) <= limit else message[: limit - 3] + "..."


def load_entry(path: str | os.PathLike[str]) -> AtlasEntry:
    """Read (bounded) and parse one entry file."""
    try:
        raw = read_bounded(path, MAX_ENTRY_BYTES)
    except InputTooLarge as exc:
        raise AtlasError(path, "$", f"not read: {exc}") from None
    except OSError as exc:
        raise AtlasError(path, "$", f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AtlasError(path, "$", f"not UTF-8 (byte {exc.start})") from None
    return parse_entry(text, str(path))


# Parsed entries by (path, inode, size, mtime): `triage check` and the proxy read the atlas
# on every call, and a file that changed gets a new key.
_CACHE: dict[tuple[str, int, int, int], AtlasEntry] = {}
_CACHE_MAX = 10_000


def _load_cached(path: Path) -> AtlasEntry:
    try:
        info = path.stat()
    except OSError:
        return load_entry(path)  # raises the error naming the file
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
    entry = _CACHE.get(key)
    if entry is None:
        entry = load_entry(path)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = entry
    return entry


def entry_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The entry files of one atlas folder (`*.md`, not README/INDEX), sorted by name."""
    root = Path(folder)
    if not root.is_dir():
        raise AtlasError(root, "$", "not a folder")
    files: list[Path] = []
    try:
        with os.scandir(root) as scan:
            for item in scan:
                if not item.name.endswith(SUFFIX) or item.name in NOT_ENTRIES:
                    continue
                files.append(root / item.name)
                if len(files) > MAX_FILES_PER_DIR:
                    raise AtlasError(root, "$", f"more than {MAX_FILES_PER_DIR} entry files")
    except OSError as exc:
        raise AtlasError(root, "$", f"cannot list: {exc.strerror or exc}") from None
    return sorted(files)


def team_dir() -> Path:
    """The team's own atlas folder, filled by `triage atlas import`: $TRIAGE_HOME/atlas."""
    return data_dir() / "atlas"


def atlas_dirs(
    extra: Iterable[str | os.PathLike[str]] = (), *, env: str | None = None
) -> list[Path]:
    """The folders read, in order (a later folder's entry replaces an earlier one's with the
    same id): shipped entries, the team folder if it exists, `$TRIAGE_ATLAS_PATH` (os.pathsep
    separated), then `extra` (`--atlas DIR`)."""
    folders = [SHIPPED_DIR]
    if team_dir().is_dir():
        folders.append(team_dir())
    value = os.environ.get(ATLAS_PATH_ENV, "") if env is None else env
    folders += [Path(part) for part in value.split(os.pathsep) if part.strip()]
    folders += [Path(item) for item in extra]
    seen: list[Path] = []
    for folder in folders:
        if folder not in seen:
            seen.append(folder)
    return seen


def load_atlas(paths: Sequence[str | os.PathLike[str]] | None = None) -> tuple[AtlasEntry, ...]:
    """Every entry of these folders (default: `atlas_dirs()`), sorted by id; a later folder
    replaces an entry of the same id. A missing shipped folder is an empty atlas; any other
    missing folder or bad file raises AtlasError."""
    folders = [Path(p) for p in paths] if paths is not None else atlas_dirs()
    by_id: dict[str, AtlasEntry] = {}
    for folder in folders:
        if folder == SHIPPED_DIR and not folder.is_dir():
            continue
        for path in entry_files(folder):
            entry = _load_cached(path)
            by_id[entry.id] = entry
    return tuple(by_id[key] for key in sorted(by_id))


# --------------------------------------------------------------------------- import
# `triage atlas import DIR`: every file of DIR is read and schema-checked first; one bad file
# refuses the whole import (the error names it) and nothing is written. Each file is then
# written through `kb.repo.fileio.write_atomic` (exclusive temporary file, rename), so a reader
# of the team folder never sees half a file.


@dataclass(frozen=True)
class ImportResult:
    """What an import did, per entry id."""

    folder: Path
    added: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    overrides_shipped: tuple[str, ...]


def import_atlas(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> ImportResult:
    """Check every entry file of `source`, then copy them into `target` (created if needed).
    Raises AtlasError (nothing written) when any file is refused or `source` has none."""
    source_dir, target_dir = Path(source), Path(target)
    files = entry_files(source_dir)
    if not files:
        raise AtlasError(source_dir, "$", "no entry files (*.md) in this folder")
    if source_dir.resolve() == target_dir.resolve():
        raise AtlasError(source_dir, "$", "this is the team atlas folder itself")
    checked: list[tuple[str, bytes]] = []
    for path in files:
        entry = load_entry(path)  # raises on the first bad file; nothing written yet
        checked.append((entry.id, read_bounded(path, MAX_ENTRY_BYTES)))
    shipped = set()
    if SHIPPED_DIR.is_dir():
        shipped = {p.name.removesuffix(".md") for p in entry_files(SHIPPED_DIR)}
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AtlasError(target_dir, "$", f"cannot create: {exc.strerror or exc}") from None
    added: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    for entry_id, data in checked:
        destination = target_dir / f"{entry_id}.md"
        old = None
        if destination.is_file():
            try:
                old = read_bounded(destination, MAX_ENTRY_BYTES)
            except OSError:
                old = None  # unreadable or oversized: replace it
        if old == data:
            unchanged.append(entry_id)
            continue
        try:
            write_atomic(destination, data)
        except OSError as exc:
            raise AtlasError(destination, "$", f"cannot write: {exc.strerror or exc}") from None
        (updated if old is not None else added).append(entry_id)
    return ImportResult(
        folder=target_dir,
        added=tuple(added),
        updated=tuple(updated),
        unchanged=tuple(unchanged),
        overrides_shipped=tuple(sorted(shipped & {entry_id for entry_id, _ in checked})),
    )
