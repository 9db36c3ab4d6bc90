"""Incident files (`incidents/<slug>.md`) <-> the knowledge base.

A file is YAML front matter between two `---` lines (the structured record, validated by
`kb/schemas/incident.schema.json` and the referential checks: kb.repo.fileparse) followed
by the Markdown narrative. Import validates every file before writing anything, then writes in
atomic batches (`IMPORT_BATCH` incidents each; an import cut short resumes when run again,
see `import_files`). Export writes the canonical form:

- front matter keys in a fixed order; free-form maps (stack extras, payload, observed,
  trigger extras) keep their stored order;
- optional keys whose value is empty ("", [], {}, null) are omitted -- and an omitted
  key imports as empty; `verified` of a decision is always written (false if omitted);
  a cause's `catalogue` is always written (it defaults to the cause id);
- timestamps in UTC: a bare date for 00:00:00 UTC (day precision), else
  `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`;
- YAML in block style, literal block scalars for multi-line strings, unicode as is.

A file already in canonical form (every file export wrote) round-trips byte for byte;
any valid file reaches the canonical form after one import/export.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from datetime import date
from pathlib import Path

from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, select

from kb.domain.errors import StoreError
from kb.domain.retroformat import replace_retro_section, retro_section
from kb.filecheck import RecordError
from kb.jsontypes import JsonObject
from kb.models import (
    Cause,
    Decision,
    EvidenceLink,
    FamilyLink,
    Incident,
    Reference,
    Symptom,
)
from kb.repo.engine import describe_db_error
from kb.repo.fileio import (
    dump_yaml,
    load_yaml,
    write_atomic,
)
from kb.repo.fileparse import FRONT_MATTER_FENCE, INCIDENT_KEYS, parse_file, parse_text
from kb.repo.filerecord import (
    _timeline_entry,
    _trigger,
    format_timestamp,
    list_records,
    load_record,
    parse_timestamp,
)
from kb.repo.importbatch import IMPORT_BATCH, ImportResult, already_imported, import_batches
from kb.repo.sidecar import (
    decode_sidecar,
    encode_sidecar,
    sidecar_paths,
    split_evidence,
)
from kb.repo.store import Store, add_evidence, get_incident, record_status_change

__all__ = [
    "IMPORT_BATCH",
    "ExportError",
    "RecordError",
    "dump_yaml",
    "export_all",
    "export_incident",
    "export_incidents",
    "format_timestamp",
    "ImportResult",
    "import_files",
    "import_paths",
    "incident_paths",
    "list_records",
    "load_record",
    "load_yaml",
    "parse_timestamp",
    "render_record",
]


# --------------------------------------------------------------------------- time


# --------------------------------------------------------------------------- parsing


# --------------------------------------------------------------------------- import


class _DryRun(Exception):
    """Raised inside the import transaction to roll it back on purpose."""


def incident_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files to import: each file as given, each directory's *.md sorted; duplicates once."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            candidates = sorted(p for p in path.glob("*.md") if p.is_file())
        elif path.is_file():
            candidates = [path]
        else:
            raise RecordError(path, "$", "no such file or directory")
        for candidate in candidates:
            resolved = candidate.resolve()
            if resolved not in seen:
                seen.add(resolved)
                found.append(candidate)
    return found


def import_paths(
    store: Store,
    paths: Iterable[str | os.PathLike[str]],
    *,
    dry_run: bool = False,
    batch: int = IMPORT_BATCH,
    causes: Collection[str] | None = None,
) -> list[str]:
    """Validate then import incident files (see `import_files`); the slugs imported."""
    return import_files(store, paths, dry_run=dry_run, batch=batch, causes=causes).imported


def import_files(
    store: Store,
    paths: Iterable[str | os.PathLike[str]],
    *,
    dry_run: bool = False,
    batch: int = IMPORT_BATCH,
    progress: Callable[[int, int], None] | None = None,
    causes: Collection[str] | None = None,
) -> ImportResult:
    """Validate every file, then import them `batch` incidents per transaction.

    Validation is all-or-nothing: any error raises (RecordError names the file and field)
    before anything is stored. The writes are then committed in atomic batches: incidents
    linked by `family` within the import share a batch (an incident is never split), so a
    batch may exceed `batch` to keep such a group whole. An import cut short (killed, a
    full disk) keeps its whole batches; running it again skips each incident already stored
    from the same file with the same content and stores the rest, each once. An incident
    already stored that differs (or came from another file) is an error, as before.
    `dry_run` runs every check and the inserts in one transaction, then rolls back.
    `progress(done, total)` is called after each committed batch. `causes` is the
    catalogue's list of cause ids (a cause id not in it must name the one it refines).
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    files = incident_paths(paths)
    records = [(str(path), parse_file(path, causes)) for path in files]
    by_slug: dict[str, tuple[str, JsonObject]] = {}
    for file, record in records:
        if record["slug"] in by_slug:
            other = by_slug[record["slug"]][0]
            raise RecordError(
                file, "$.slug", f"duplicate slug {record['slug']!r} (also in {other})"
            )
        by_slug[record["slug"]] = (file, record)
    result = ImportResult()
    try:
        with store.session(readonly=True) as session:
            stored = _check_against_database(session, records, by_slug)
        result.skipped = [r["slug"] for _f, r in records if r["slug"] in stored]
        todo = [(file, record) for file, record in records if record["slug"] not in stored]
        if dry_run:
            try:
                with store.session() as session:
                    _write_batch(session, todo, {})
                    raise _DryRun
            except _DryRun:
                pass
            result.imported = [record["slug"] for _file, record in todo]
            return result
        cause_ids: dict[tuple[str, str], int] = {}
        done = 0
        for group in import_batches(todo, batch):
            with store.session() as session:
                _write_batch(session, group, cause_ids)
            result.batches += 1
            result.imported.extend(record["slug"] for _file, record in group)
            done += len(group)
            if progress is not None:
                progress(done, len(todo))
    except IntegrityError as exc:
        # Typically the loser of two imports of the same file running at once.
        raise StoreError(
            f"the database refused the import: {describe_db_error(exc)} "
            "(did another import store the same incident at the same time?)" + _kept(result)
        ) from None
    except SQLAlchemyError as exc:
        raise StoreError(
            f"the database refused the import: {describe_db_error(exc)}" + _kept(result)
        ) from None
    return result


def _kept(result: ImportResult) -> str:
    if not result.batches:
        return ""
    return (
        f"; {len(result.imported)} incident(s) of {result.batches} earlier batch(es) are "
        "stored: run the import again to store the rest"
    )


def _write_batch(
    session: Session,
    group: list[tuple[str, JsonObject]],
    cause_ids: dict[tuple[str, str], int],
) -> None:
    """One batch in the caller's transaction: the incidents, then their family links."""
    for file, record in group:
        cause_ids.update(_insert_record(session, record, file))
    for _file, record in group:
        _insert_family(session, record, cause_ids)


def _check_against_database(
    session: Session,
    records: list[tuple[str, JsonObject]],
    by_slug: dict[str, tuple[str, JsonObject]],
) -> set[str]:
    """Check the records against what is stored; the slugs already imported from the same
    files (to skip)."""
    stored: set[str] = set()
    for file, record in records:
        existing = get_incident(session, record["slug"])
        if existing is not None:
            if already_imported(session, existing, file, record):
                stored.add(record["slug"])
                continue
            where = f" (imported from {existing.source_file})" if existing.source_file else ""
            raise RecordError(
                file, "$.slug", f"an incident with slug {record['slug']!r} is already stored{where}"
            )
    for file, record in records:
        for index, link in enumerate(record.get("family", [])):
            path = f"$.family[{index}]"
            target = link["incident"]
            if target in by_slug:
                causes = {c["id"] for c in by_slug[target][1].get("causes", [])}
            else:
                incident = get_incident(session, target)
                if incident is None:
                    raise RecordError(
                        file,
                        f"{path}.incident",
                        f"no incident {target!r} in the database or in this import",
                    )
                causes = set(
                    session.exec(select(Cause.key).where(Cause.incident_id == incident.id)).all()
                )
            if link["other_cause"] not in causes:
                raise RecordError(
                    file,
                    f"{path}.other_cause",
                    f"incident {target!r} has no cause {link['other_cause']!r}",
                )
    return stored


def _insert_incident(session: Session, record: JsonObject, file: str) -> int:
    """The incident row itself (stack columns split from the free-form extras); its id."""
    stack = dict(record.get("stack", {}))
    incident = Incident(
        slug=record["slug"],
        title=record["title"],
        status=record["status"],
        opened_on=date.fromisoformat(record["opened"]),
        closed_on=date.fromisoformat(record["closed"]) if record.get("closed") else None,
        summary=record.get("summary", ""),
        impact=record.get("impact", ""),
        model=stack.pop("model", ""),
        weights=stack.pop("weights", ""),
        server_build=stack.pop("server_build", ""),
        flags=stack.pop("flags", []),
        stack=stack,
        timeline=[_timeline_entry(entry) for entry in record.get("timeline", [])],
        body=record["body"],
        source_file=file[-500:],
    )
    session.add(incident)
    session.flush()
    assert incident.id is not None
    return incident.id


def _insert_evidence(session: Session, incident_id: int, record: JsonObject) -> dict[str, int]:
    """The incident's evidence; the stored id of each evidence key."""
    evidence_ids: dict[str, int] = {}
    for item in record.get("evidence", []):
        stored = add_evidence(
            session,
            incident_id=incident_id,
            key=item["id"],
            kind=item["kind"],
            summary=item["summary"],
            payload=item.get("payload", {}),
            source=item.get("source", ""),
            recorded_at=parse_timestamp(item["recorded_at"]),
        )
        assert stored.id is not None
        evidence_ids[item["id"]] = stored.id
    return evidence_ids


def _insert_symptoms(session: Session, incident_id: int, record: JsonObject) -> None:
    for symptom in record.get("symptoms", []):
        session.add(
            Symptom(
                incident_id=incident_id,
                key=symptom["id"],
                kind=symptom.get("kind", ""),
                description=symptom["description"],
                observed=symptom.get("observed", {}),
                evidence_keys=list(symptom.get("evidence", [])),
            )
        )


def _insert_cause(
    session: Session,
    incident_id: int,
    item: JsonObject,
    evidence_ids: dict[str, int],
    file: str,
) -> int:
    """One cause, its evidence links and its status history (replayed in order); its id."""
    history = item.get("history", [])
    cause = Cause(
        incident_id=incident_id,
        key=item["id"],
        catalogue_id=item["catalogue"] if "catalogue" in item else item["id"],
        title=item["title"],
        status=history[0]["to"] if history else item["status"],
        basis=item["basis"],
        rationale=item.get("rationale", ""),
        deciding_probe=item.get("deciding_probe", ""),
    )
    session.add(cause)
    session.flush()
    assert cause.id is not None
    for link in item.get("evidence", []):
        session.add(
            EvidenceLink(
                cause_id=cause.id,
                evidence_id=evidence_ids[link["id"]],
                relation=link["relation"],
                note=link.get("note", ""),
            )
        )
    if not history:
        record_status_change(
            session,
            cause,
            item["status"],
            actor="import",
            rationale=f"status as recorded in {Path(file).name}, which had no history",
        )
    for change in history:
        record_status_change(
            session,
            cause,
            change["to"],
            actor=change["actor"],
            rationale=change["rationale"],
            evidence_keys=list(change.get("evidence", [])),
            at=parse_timestamp(change["at"]),
        )
    return cause.id


def _insert_decisions(session: Session, incident_id: int, record: JsonObject) -> None:
    for decision in record.get("decisions", []):
        session.add(
            Decision(
                incident_id=incident_id,
                kind=decision["kind"],
                decided_at=parse_timestamp(decision["at"]),
                decided_by=decision.get("by", ""),
                rationale=decision["rationale"],
                tradeoff=decision.get("tradeoff", ""),
                fix=decision.get("fix", ""),
                verified=decision.get("verified", False),
                revisit_on=(
                    date.fromisoformat(decision["revisit_on"])
                    if decision.get("revisit_on")
                    else None
                ),
                revisit_triggers=[_trigger(t) for t in decision.get("triggers", [])],
                evidence_keys=list(decision.get("evidence", [])),
            )
        )


def _insert_references(session: Session, incident_id: int, record: JsonObject) -> None:
    for reference in record.get("references", []):
        session.add(
            Reference(
                incident_id=incident_id,
                url=reference.get("url", ""),
                title=reference.get("title", ""),
                note=reference.get("note", ""),
            )
        )


def _insert_record(session: Session, record: JsonObject, file: str) -> dict[tuple[str, str], int]:
    """One validated record (all but its family links); the stored id of each (slug, cause)."""
    incident_id = _insert_incident(session, record, file)
    evidence_ids = _insert_evidence(session, incident_id, record)
    _insert_symptoms(session, incident_id, record)
    cause_ids = {
        (record["slug"], item["id"]): _insert_cause(session, incident_id, item, evidence_ids, file)
        for item in record.get("causes", [])
    }
    _insert_decisions(session, incident_id, record)
    _insert_references(session, incident_id, record)
    session.flush()
    return cause_ids


def _insert_family(
    session: Session, record: JsonObject, cause_ids: dict[tuple[str, str], int]
) -> None:
    for link in record.get("family", []):
        target = (link["incident"], link["other_cause"])
        if target not in cause_ids:  # stored before this import (checked to exist)
            incident = get_incident(session, link["incident"])
            assert incident is not None
            cause = session.exec(
                select(Cause).where(
                    Cause.incident_id == incident.id, Cause.key == link["other_cause"]
                )
            ).one()
            assert cause.id is not None
            cause_ids[target] = cause.id
        session.add(
            FamilyLink(
                from_cause_id=cause_ids[(record["slug"], link["cause"])],
                to_cause_id=cause_ids[target],
                note=link.get("note", ""),
            )
        )
    session.flush()


# --------------------------------------------------------------------------- export


def render_record(record: JsonObject, *, front: JsonObject | None = None) -> str:
    """The canonical file text of a record (as returned by `load_record`).

    `front`: the record to write as front matter when it differs from the one the
    retrospective is generated from (export puts replay evidence in the sidecar).
    """
    # The retrospective is generated from the record on every export and replaces the one
    # the body held (between its markers), so re-import and re-export stay byte-stable.
    shown = front if front is not None else record
    matter = {key: shown[key] for key in INCIDENT_KEYS if key in shown}
    body = replace_retro_section(str(record.get("body", "")), retro_section(record))
    return f"{FRONT_MATTER_FENCE}\n{dump_yaml(matter)}{FRONT_MATTER_FENCE}\n{body}"


def _checked_files(record: JsonObject, path: Path) -> tuple[str, tuple[str, bytes] | None]:
    """The file text and evidence sidecar (suffix, bytes) of a record, validated like a
    file being imported.

    Rows written by other parts of the product (the engine) pass the same checks, so export
    never writes a file that import would refuse; the error names the file and field.
    """
    front_evidence, side_evidence = split_evidence(list(record.get("evidence", [])))
    front = {**record, "evidence": front_evidence}
    if not front_evidence:
        del front["evidence"]
    text = render_record(record, front=front)
    sidecar = encode_sidecar(side_evidence) if side_evidence else None
    side = None
    if sidecar is not None:
        side_name = str(path.with_name(path.name.removesuffix(".md") + sidecar[0]))
        side = (side_name, decode_sidecar(sidecar[1], side_name, sidecar[0].endswith(".gz")))
    parse_text(text, str(path), side)
    return text, sidecar


def _write(path: Path, text: str) -> None:
    # An exclusive temporary file in the folder, then rename (kb.repo.fileio.write_atomic): a
    # reader never sees half a file and a pre-planted `.<slug>.md.tmp` link is never followed.
    write_atomic(path, text.encode("utf-8"))


def _write_files(path: Path, text: str, sidecar: tuple[str, bytes] | None) -> None:
    """The sidecar first (so the file never names evidence that is not there yet), then the
    file; a sidecar of the other form (or of a record that has none now) is removed."""
    for candidate in sidecar_paths(path):
        if sidecar is not None and candidate.name.endswith(sidecar[0]):
            write_atomic(candidate, sidecar[1])
        elif candidate.is_file() or candidate.is_symlink():
            candidate.unlink()
    _write(path, text)


class ExportError(RecordError):
    """Some incidents could not be exported (each named with its field); the others were."""

    def __init__(self, failures: list[RecordError], written: list[Path]) -> None:
        first = failures[0]
        super().__init__(first.file, first.json_path, first.message)
        self.failures = failures
        self.written = written
        self.args = ("\n".join(str(f) for f in failures),)

    def __str__(self) -> str:
        return str(self.args[0])


def _export_one(store: Store, slug: str, out: Path) -> tuple[Path, str, tuple[str, bytes] | None]:
    path = out / f"{slug}.md"
    try:
        with store.session(readonly=True) as session:
            record = load_record(session, slug)
        return (path, *_checked_files(record, path))
    except RecordError:
        raise
    except StoreError as exc:
        raise RecordError(path, "$", str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:  # rows no file could hold
        raise RecordError(path, "$", f"cannot render the record: {exc!r}") from None


def export_incidents(
    store: Store, out_dir: str | os.PathLike[str], slugs: Iterable[str] | None = None
) -> tuple[list[Path], list[RecordError]]:
    """Write incidents (all, by slug, or the `slugs` given) to `<out_dir>/<slug>.md`.

    One bad record never blocks the others: each is rendered and checked like a file being
    imported, the good ones are written, and the refused ones come back as errors naming
    the file and field. Returns (paths written, errors).
    """
    if slugs is None:
        with store.session(readonly=True) as session:
            slugs = sorted(session.exec(select(Incident.slug)).all())
    out = Path(out_dir)
    texts: list[tuple[Path, str, tuple[str, bytes] | None]] = []
    errors: list[RecordError] = []
    for slug in slugs:
        try:
            texts.append(_export_one(store, slug, out))
        except RecordError as exc:
            errors.append(exc)
    if texts:
        out.mkdir(parents=True, exist_ok=True)
    for path, text, sidecar in texts:
        _write_files(path, text, sidecar)
    return [path for path, _text, _sidecar in texts], errors


def export_incident(store: Store, slug: str, out_dir: str | os.PathLike[str]) -> Path:
    """Write one incident to `<out_dir>/<slug>.md`; the path written."""
    written, errors = export_incidents(store, out_dir, [slug])
    if errors:
        raise errors[0]
    return written[0]


def export_all(store: Store, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write every stored incident to `<out_dir>/<slug>.md`; the paths written, by slug.

    A record export would refuse does not stop the others: they are written, then
    ExportError (a RecordError) names every refused one.
    """
    written, errors = export_incidents(store, out_dir)
    if errors:
        raise ExportError(errors, written)
    return written
