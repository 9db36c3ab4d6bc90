"""Incident files (`incidents/<slug>.md`) <-> the knowledge base.

A file is YAML front matter between two `---` lines (the structured record, validated by
`kb/schemas/incident.schema.json` and the referential checks below) followed by the
Markdown narrative. Import validates every file of a batch before writing anything and
writes the whole batch in one transaction. Export writes the canonical form:

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

import json
import math
import os
import re
from collections.abc import Iterable
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, select

from kb.fileio import (
    MAX_FILE_BYTES,
    InputTooLarge,
    dump_yaml,
    load_yaml,
    read_bounded,
    write_atomic,
)
from kb.filerecord import (
    _timeline_entry,
    _trigger,
    format_timestamp,
    list_records,
    load_record,
    parse_timestamp,
)
from kb.models import (
    CAUSE_CATALOGUE_IDS,
    Cause,
    Decision,
    EvidenceLink,
    FamilyLink,
    Incident,
    Reference,
    Symptom,
)
from kb.store import (
    Store,
    StoreError,
    add_evidence,
    describe_db_error,
    get_incident,
    record_status_change,
)

__all__ = [
    "ExportError",
    "RecordError",
    "SCHEMA_PATH",
    "dump_yaml",
    "export_all",
    "export_incident",
    "export_incidents",
    "format_timestamp",
    "import_paths",
    "incident_paths",
    "list_records",
    "load_record",
    "load_yaml",
    "parse_file",
    "parse_text",
    "parse_timestamp",
    "render_record",
]

SCHEMA_PATH = Path(__file__).parent / "schemas" / "incident.schema.json"
FRONT_MATTER_FENCE = "---"

# Front matter key order; export writes exactly these keys in this order.
INCIDENT_KEYS = (
    "slug",
    "title",
    "status",
    "opened",
    "closed",
    "summary",
    "impact",
    "stack",
    "timeline",
    "symptoms",
    "evidence",
    "causes",
    "decisions",
    "references",
    "family",
)
STACK_KEYS = ("model", "weights", "server_build", "flags")


class RecordError(StoreError):
    """An incident file the knowledge base refuses: which file, which field, what is wrong."""

    def __init__(self, file: str | os.PathLike[str], json_path: str, message: str) -> None:
        self.file = str(file)
        self.json_path = json_path
        self.message = message
        super().__init__(f"{self.file}: {json_path}: {message}")


# --------------------------------------------------------------------------- time


_DATE_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$")


def _is_date_time(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    if not _DATE_TIME_RE.match(instance):
        return False
    datetime.fromisoformat(instance)  # ValueError for e.g. month 13
    return True


def _is_uri(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+[^\s]*$", instance))


def _format_checker() -> FormatChecker:
    checker = FormatChecker()
    # jsonschema checks "date-time" and "uri" only when optional extra packages are
    # installed; these two small checkers keep validation the same on every install.
    checker.checks("date-time", raises=ValueError)(_is_date_time)
    checker.checks("uri")(_is_uri)
    return checker


# --------------------------------------------------------------------------- parsing


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_format_checker())


def _json_path(parts: Iterable[str | int]) -> str:
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", part):
            path += f".{part}"
        else:
            path += "[" + json.dumps(part, ensure_ascii=False) + "]"
    return path


def _check_plain_data(value: Any, file: str, parts: list[str | int]) -> None:
    """Only what JSON (and PostgreSQL text) can hold, so a record stores and exports as read."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecordError(
                    file, _json_path(parts), f"key {key!r} must be a string (quote it)"
                )
            _check_plain_data(key, file, parts)
            _check_plain_data(item, file, [*parts, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_plain_data(item, file, [*parts, index])
    elif isinstance(value, str):
        if "\x00" in value:
            raise RecordError(file, _json_path(parts), "text contains a NUL character")
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            raise RecordError(file, _json_path(parts), "text contains a lone surrogate")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise RecordError(file, _json_path(parts), f"{value!r} is not a finite number")
    elif value is None or isinstance(value, (bool, int)):
        pass
    else:
        raise RecordError(
            file, _json_path(parts), f"unsupported YAML value of type {type(value).__name__}"
        )


def split_front_matter(text: str, file: str) -> tuple[str, str]:
    """(YAML text, Markdown body) of a file's text."""
    if not text.startswith(FRONT_MATTER_FENCE + "\n"):
        raise RecordError(file, "$", "the file must start with a '---' line (YAML front matter)")
    rest = text[len(FRONT_MATTER_FENCE) + 1 :]
    match = re.search(r"^---[ \t]*(?:\n|\Z)", rest, flags=re.MULTILINE)
    if match is None:
        raise RecordError(file, "$", "the front matter has no closing '---' line")
    return rest[: match.start()], rest[match.end() :]


def parse_text(text: str, file: str = "<text>") -> dict[str, Any]:
    """Parse and validate one incident file's text: the front matter dict plus `body`."""
    text = text.replace("\r\n", "\n")
    front, body = split_front_matter(text, file)
    try:
        data = load_yaml(front)
    except RecursionError:  # a backstop: the loader limits nesting well below this
        raise RecordError(file, "$", "invalid YAML front matter: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecordError(file, "$", f"invalid YAML front matter{where}: {problem}") from None
    if not isinstance(data, dict):
        raise RecordError(file, "$", "the front matter must be a YAML mapping")
    _check_plain_data(data, file, [])
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        raise RecordError(file, error.json_path, error.message)
    _check_references(data, file)
    stem = Path(file).name.removesuffix(".md") if file.endswith(".md") else None
    if stem is not None and stem != data["slug"]:
        raise RecordError(
            file, "$.slug", f"slug {data['slug']!r} does not match the file name {stem!r}.md"
        )
    from kb.retro import strip_retro_section

    record = dict(data)
    # The generated retrospective is derived from the record: not part of it, rewritten on
    # every export (render_record).
    record["body"] = strip_retro_section(body)
    return record


def parse_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and validate one incident file (see `parse_text`)."""
    name = str(path)
    try:
        raw = read_bounded(path, MAX_FILE_BYTES)
    except InputTooLarge as exc:
        raise RecordError(name, "$", f"cannot read the file: {exc}") from None
    except OSError as exc:
        raise RecordError(name, "$", f"cannot read the file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(name, "$", f"not UTF-8 text (byte {exc.start})") from None
    return parse_text(text, name)


def _check_references(data: dict[str, Any], file: str) -> None:
    """The checks JSON Schema cannot express: ids, links, history, dates."""
    slug: str = data["slug"]
    opened = date.fromisoformat(data["opened"])
    if slug[:10] != data["opened"]:
        raise RecordError(
            file, "$.slug", f"slug date {slug[:10]} does not match opened {data['opened']}"
        )
    if data.get("closed") and date.fromisoformat(data["closed"]) < opened:
        raise RecordError(file, "$.closed", f"closed {data['closed']} is before opened")

    evidence_ids: set[str] = set()
    for index, item in enumerate(data.get("evidence", [])):
        if item["id"] in evidence_ids:
            raise RecordError(
                file, f"$.evidence[{index}].id", f"duplicate evidence id {item['id']!r}"
            )
        evidence_ids.add(item["id"])

    def known(ids: list[str], path: str) -> None:
        for index, key in enumerate(ids):
            if key not in evidence_ids:
                raise RecordError(
                    file, f"{path}[{index}]", f"no evidence with id {key!r} in this file"
                )

    for index, entry in enumerate(data.get("timeline", [])):
        known(entry.get("evidence", []), f"$.timeline[{index}].evidence")

    symptom_ids: set[str] = set()
    for index, symptom in enumerate(data.get("symptoms", [])):
        if symptom["id"] in symptom_ids:
            raise RecordError(
                file, f"$.symptoms[{index}].id", f"duplicate symptom id {symptom['id']!r}"
            )
        symptom_ids.add(symptom["id"])
        known(symptom.get("evidence", []), f"$.symptoms[{index}].evidence")

    cause_ids: set[str] = set()
    for index, cause in enumerate(data.get("causes", [])):
        path = f"$.causes[{index}]"
        key = cause["id"]
        if key in cause_ids:
            raise RecordError(file, f"{path}.id", f"duplicate cause id {key!r}")
        cause_ids.add(key)
        catalogue = cause.get("catalogue")
        if key in CAUSE_CATALOGUE_IDS:
            if catalogue not in (None, key):
                raise RecordError(
                    file,
                    f"{path}.catalogue",
                    f"catalogue cause {key!r} cannot refine {catalogue!r}; "
                    "give the sub-hypothesis its own id",
                )
        elif catalogue is None:
            raise RecordError(
                file,
                f"{path}.id",
                f"unknown cause id {key!r}: not a catalogue id ({', '.join(CAUSE_CATALOGUE_IDS)}) "
                "and no `catalogue` field naming the catalogue cause it refines",
            )
        links: set[tuple[str, str]] = set()
        for link_index, link in enumerate(cause.get("evidence", [])):
            link_path = f"{path}.evidence[{link_index}]"
            if link["id"] not in evidence_ids:
                raise RecordError(
                    file, f"{link_path}.id", f"no evidence with id {link['id']!r} in this file"
                )
            if (link["id"], link["relation"]) in links:
                raise RecordError(
                    file, link_path, f"duplicate link to {link['id']!r} ({link['relation']})"
                )
            links.add((link["id"], link["relation"]))
        _check_history(cause, file, path, known)

    for index, decision in enumerate(data.get("decisions", [])):
        path = f"$.decisions[{index}]"
        known(decision.get("evidence", []), f"{path}.evidence")
        revisit = decision.get("revisit_on")
        if revisit and date.fromisoformat(revisit) < parse_timestamp(decision["at"]).date():
            raise RecordError(
                file, f"{path}.revisit_on", f"revisit_on {revisit} is before the decision"
            )

    family_pairs: set[tuple[str, str, str]] = set()
    for index, link in enumerate(data.get("family", [])):
        path = f"$.family[{index}]"
        if link["cause"] not in cause_ids:
            raise RecordError(
                file, f"{path}.cause", f"no cause with id {link['cause']!r} in this file"
            )
        pair = (link["cause"], link["incident"], link["other_cause"])
        if pair in family_pairs:
            raise RecordError(file, path, "duplicate family link")
        family_pairs.add(pair)
        if link["incident"] == slug and link["other_cause"] not in cause_ids:
            raise RecordError(
                file,
                f"{path}.other_cause",
                f"no cause with id {link['other_cause']!r} in this file",
            )
        if link["incident"] == slug and link["other_cause"] == link["cause"]:
            raise RecordError(file, path, "a cause cannot be linked to itself")


def _check_history(cause: dict[str, Any], file: str, path: str, known: Any) -> None:
    history = cause.get("history", [])
    previous: str | None = None
    previous_at: datetime | None = None
    for index, change in enumerate(history):
        change_path = f"{path}.history[{index}]"
        if change.get("from") != previous:
            expected = "no `from` (first entry)" if previous is None else f"from: {previous}"
            raise RecordError(
                file,
                f"{change_path}.from",
                f"from {change.get('from')!r} does not follow the previous entry ({expected})",
            )
        at = parse_timestamp(change["at"])
        if previous_at is not None and at < previous_at:
            raise RecordError(file, f"{change_path}.at", "history entries must be in time order")
        known(change.get("evidence", []), f"{change_path}.evidence")
        previous, previous_at = change["to"], at
    if history and previous != cause["status"]:
        raise RecordError(
            file,
            f"{path}.status",
            f"status {cause['status']!r} differs from the last history entry (to: {previous})",
        )


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
    store: Store, paths: Iterable[str | os.PathLike[str]], *, dry_run: bool = False
) -> list[str]:
    """Validate then import incident files in one transaction; the slugs imported, in order.

    Any error raises (RecordError names the file and field) and leaves the database as it
    was. `dry_run` runs every check and the inserts, then rolls back.
    """
    files = incident_paths(paths)
    records = [(str(path), parse_file(path)) for path in files]
    by_slug: dict[str, tuple[str, dict[str, Any]]] = {}
    for file, record in records:
        if record["slug"] in by_slug:
            other = by_slug[record["slug"]][0]
            raise RecordError(
                file, "$.slug", f"duplicate slug {record['slug']!r} (also in {other})"
            )
        by_slug[record["slug"]] = (file, record)
    try:
        with store.session() as session:
            _check_against_database(session, records, by_slug)
            cause_ids: dict[tuple[str, str], int] = {}
            for file, record in records:
                cause_ids.update(_insert_record(session, record, file))
            for _file, record in records:
                _insert_family(session, record, cause_ids)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    except IntegrityError as exc:
        # Typically the loser of two imports of the same file running at once.
        raise StoreError(
            f"the database refused the import: {describe_db_error(exc)} "
            "(did another import store the same incident at the same time?)"
        ) from None
    except SQLAlchemyError as exc:
        raise StoreError(f"the database refused the import: {describe_db_error(exc)}") from None
    return [record["slug"] for _file, record in records]


def _check_against_database(
    session: Session,
    records: list[tuple[str, dict[str, Any]]],
    by_slug: dict[str, tuple[str, dict[str, Any]]],
) -> None:
    for file, record in records:
        existing = get_incident(session, record["slug"])
        if existing is not None:
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


def _insert_record(
    session: Session, record: dict[str, Any], file: str
) -> dict[tuple[str, str], int]:
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

    evidence_ids: dict[str, int] = {}
    for item in record.get("evidence", []):
        stored = add_evidence(
            session,
            incident_id=incident.id,
            key=item["id"],
            kind=item["kind"],
            summary=item["summary"],
            payload=item.get("payload", {}),
            source=item.get("source", ""),
            recorded_at=parse_timestamp(item["recorded_at"]),
        )
        assert stored.id is not None
        evidence_ids[item["id"]] = stored.id
    for symptom in record.get("symptoms", []):
        session.add(
            Symptom(
                incident_id=incident.id,
                key=symptom["id"],
                kind=symptom.get("kind", ""),
                description=symptom["description"],
                observed=symptom.get("observed", {}),
                evidence_keys=list(symptom.get("evidence", [])),
            )
        )

    cause_ids: dict[tuple[str, str], int] = {}
    for item in record.get("causes", []):
        history = item.get("history", [])
        cause = Cause(
            incident_id=incident.id,
            key=item["id"],
            catalogue_id=item.get("catalogue", item["id"]),
            title=item["title"],
            status=history[0]["to"] if history else item["status"],
            basis=item["basis"],
            rationale=item.get("rationale", ""),
            deciding_probe=item.get("deciding_probe", ""),
        )
        session.add(cause)
        session.flush()
        assert cause.id is not None
        cause_ids[(record["slug"], item["id"])] = cause.id
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

    for decision in record.get("decisions", []):
        session.add(
            Decision(
                incident_id=incident.id,
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
    for reference in record.get("references", []):
        session.add(
            Reference(
                incident_id=incident.id,
                url=reference.get("url", ""),
                title=reference.get("title", ""),
                note=reference.get("note", ""),
            )
        )
    session.flush()
    return cause_ids


def _insert_family(
    session: Session, record: dict[str, Any], cause_ids: dict[tuple[str, str], int]
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


def render_record(record: dict[str, Any]) -> str:
    """The canonical file text of a record (as returned by `load_record`)."""
    # The retrospective is generated from the record on every export and replaces the one
    # the body held (between its markers), so re-import and re-export stay byte-stable.
    from kb.retro import replace_retro_section, retro_section

    front = {key: record[key] for key in INCIDENT_KEYS if key in record}
    body = replace_retro_section(str(record.get("body", "")), retro_section(record))
    return f"{FRONT_MATTER_FENCE}\n{dump_yaml(front)}{FRONT_MATTER_FENCE}\n{body}"


def _checked_text(record: dict[str, Any], path: Path) -> str:
    """The file text of a record, validated like a file being imported.

    Rows written by other parts of the product (the engine) pass the same checks, so export
    never writes a file that import would refuse; the error names the file and field.
    """
    text = render_record(record)
    parse_text(text, str(path))
    return text


def _write(path: Path, text: str) -> None:
    # An exclusive temporary file in the folder, then rename (kb.fileio.write_atomic): a
    # reader never sees half a file and a pre-planted `.<slug>.md.tmp` link is never followed.
    write_atomic(path, text.encode("utf-8"))


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


def _export_one(store: Store, slug: str, out: Path) -> tuple[Path, str]:
    path = out / f"{slug}.md"
    try:
        with store.session(readonly=True) as session:
            record = load_record(session, slug)
        return path, _checked_text(record, path)
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
    texts: list[tuple[Path, str]] = []
    errors: list[RecordError] = []
    for slug in slugs:
        try:
            texts.append(_export_one(store, slug, out))
        except RecordError as exc:
            errors.append(exc)
    if texts:
        out.mkdir(parents=True, exist_ok=True)
    for path, text in texts:
        _write(path, text)
    return [path for path, _text in texts], errors


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
