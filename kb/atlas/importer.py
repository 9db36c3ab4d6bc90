"""`triage atlas import DIR`: check a team's entry files and copy them into its atlas folder.

Every file of DIR is read and schema-checked first; one bad file refuses the whole import
(the error names it) and nothing is written. Each file is then written through
`kb.fileio.write_atomic` (exclusive temporary file, rename), so a reader of the team folder
never sees half a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kb.atlas.loader import MAX_ENTRY_BYTES, SHIPPED_DIR, AtlasError, entry_files, load_entry
from kb.fileio import read_bounded, write_atomic

__all__ = ["ImportResult", "import_atlas"]


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
