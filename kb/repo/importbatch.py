"""Batching of `triage import` (kb/files.py): which incidents share a transaction, and
whether a stored incident is a file imported before (so a cut-short import resumes)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session

from kb.jsontypes import JsonObject
from kb.models import Incident
from kb.repo.filerecord import load_record

# Incidents committed per transaction by `import` (a whole import in one transaction held
# SQLite's write lock for its whole duration).
IMPORT_BATCH = 200


@dataclass
class ImportResult:
    """What an import did: the slugs stored now, the slugs already stored from the same file
    (an import cut short and run again), and how many batches were committed."""

    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    batches: int = 0


def import_batches(
    records: list[tuple[str, JsonObject]], size: int
) -> Iterator[list[tuple[str, JsonObject]]]:
    """Batches of about `size` records, in file order; the records linked by `family` within
    this list (directly or through others) always share a batch."""
    index = {record["slug"]: n for n, (_file, record) in enumerate(records)}
    parent = list(range(len(records)))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n, (_file, record) in enumerate(records):
        for link in record.get("family", []):
            other = index.get(link["incident"])
            if other is not None:
                parent[root(n)] = root(other)
    groups: dict[int, list[int]] = {}
    for n in range(len(records)):
        groups.setdefault(root(n), []).append(n)
    current: list[int] = []
    for members in sorted(groups.values(), key=lambda m: m[0]):
        if current and len(current) + len(members) > size:
            yield [records[n] for n in sorted(current)]
            current = []
        current.extend(members)
    if current:
        yield [records[n] for n in sorted(current)]


def _fingerprint(record: JsonObject) -> tuple[Any, ...]:
    """What must match for a stored incident to be this file's record imported before: the
    text fields, and the ids, kinds and statuses of what it holds."""
    return (
        record["title"],
        record["status"],
        record.get("summary", ""),
        record.get("impact", ""),
        record.get("body", ""),
        sorted((e["id"], e["kind"], e["summary"]) for e in record.get("evidence", [])),
        sorted((c["id"], c["status"]) for c in record.get("causes", [])),
        sorted(s["id"] for s in record.get("symptoms", [])),
        len(record.get("decisions", [])),
        len(record.get("references", [])),
        sorted((f["cause"], f["incident"], f["other_cause"]) for f in record.get("family", [])),
    )


def already_imported(session: Session, existing: Incident, file: str, record: Any) -> bool:
    """Whether a stored incident is this file imported before (a resumed import)."""
    if existing.source_file != file[-500:]:
        return False
    return _fingerprint(load_record(session, existing.slug)) == _fingerprint(record)
