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
from datetime import date, datetime, time, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from kb.models import (
    CAUSE_CATALOGUE_IDS,
    Cause,
    CauseStatusChange,
    Decision,
    Evidence,
    EvidenceLink,
    FamilyLink,
    Incident,
    Reference,
    Symptom,
)
from kb.store import Store, StoreError, add_evidence, get_incident, record_status_change

__all__ = [
    "RecordError",
    "SCHEMA_PATH",
    "dump_yaml",
    "export_all",
    "export_incident",
    "import_paths",
    "incident_paths",
    "list_records",
    "load_record",
    "load_yaml",
    "parse_file",
    "parse_text",
    "render_record",
]

SCHEMA_PATH = Path(__file__).parent / "schemas" / "incident.schema.json"
FRONT_MATTER_FENCE = "---"
YAML_WIDTH = 100

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


# --------------------------------------------------------------------------- YAML


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_STR_TAG = "tag:yaml.org,2002:str"


def _without_timestamps(
    resolvers: dict[Any, list[tuple[str, Any]]],
) -> dict[Any, list[tuple[str, Any]]]:
    return {
        first: [(tag, regexp) for tag, regexp in entries if tag != _TIMESTAMP_TAG]
        for first, entries in resolvers.items()
    }


class _Loader(yaml.SafeLoader):
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
    """Parse YAML safely; dates/datetimes stay strings; duplicate keys raise yaml.YAMLError."""
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


# --------------------------------------------------------------------------- time


_DATE_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


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


def parse_timestamp(value: str) -> datetime:
    """A file timestamp (date or RFC 3339 date-time) as an aware UTC datetime."""
    if _DATE_RE.match(value):
        return datetime.combine(date.fromisoformat(value), time(0), tzinfo=timezone.utc)
    return datetime.fromisoformat(value).astimezone(timezone.utc)


def format_timestamp(value: datetime) -> str:
    """The canonical file form of a stored timestamp."""
    if value.tzinfo is None:  # SQLite hands back naive values; the store writes UTC
        value = value.replace(tzinfo=timezone.utc)
    value = value.astimezone(timezone.utc)
    if (value.hour, value.minute, value.second, value.microsecond) == (0, 0, 0, 0):
        return value.date().isoformat()
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + "Z"


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
        raw = Path(path).read_bytes()
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
    except SQLAlchemyError as exc:
        raise StoreError(f"the database refused the import: {exc}") from exc
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


# --------------------------------------------------------------------------- records


def _drop_empty(pairs: Iterable[tuple[str, Any]], *required: str) -> dict[str, Any]:
    """The canonical rule: optional keys with an empty value are not written.

    Keys the schema requires are always written, even when empty, so that a bad stored
    value shows up as a validation error instead of silently vanishing from the file.
    """
    return {
        key: value for key, value in pairs if key in required or value not in ("", None, [], {})
    }


def _timeline_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return _drop_empty(
        [
            ("at", entry["at"]),
            ("event", entry["event"]),
            ("evidence", list(entry.get("evidence", []))),
        ],
        "at",
        "event",
    )


def _trigger(trigger: dict[str, Any]) -> dict[str, Any]:
    return {"kind": trigger["kind"], **{k: v for k, v in trigger.items() if k != "kind"}}


def _rows(session: Session, model: Any, *where: Any) -> list[Any]:
    return list(session.exec(select(model).where(*where).order_by(model.id)).all())


def load_record(session: Session, slug: str) -> dict[str, Any]:
    """The full record of one incident as a plain dict: the canonical front matter + `body`."""
    incident = get_incident(session, slug)
    if incident is None:
        raise StoreError(f"no incident with slug {slug!r}")
    evidence = _rows(session, Evidence, Evidence.incident_id == incident.id)
    evidence_keys = {row.id: row.key for row in evidence}
    causes = _rows(session, Cause, Cause.incident_id == incident.id)
    cause_rows = {row.id: row for row in causes}

    stack = _drop_empty(
        [
            ("model", incident.model),
            ("weights", incident.weights),
            ("server_build", incident.server_build),
            ("flags", list(incident.flags)),
        ]
    )
    stack.update(incident.stack)

    cause_records = []
    for cause in causes:
        links = [
            _drop_empty(
                [
                    ("id", evidence_keys[link.evidence_id]),
                    ("relation", link.relation),
                    ("note", link.note),
                ],
                "id",
                "relation",
            )
            for link in _rows(session, EvidenceLink, EvidenceLink.cause_id == cause.id)
        ]
        history = [
            _drop_empty(
                [
                    ("from", change.from_status),
                    ("to", change.to_status),
                    ("at", format_timestamp(change.changed_at)),
                    ("actor", change.actor),
                    ("rationale", change.rationale),
                    ("evidence", list(change.evidence_keys)),
                ],
                "to",
                "at",
                "actor",
                "rationale",
            )
            for change in _rows(session, CauseStatusChange, CauseStatusChange.cause_id == cause.id)
        ]
        cause_records.append(
            _drop_empty(
                [
                    ("id", cause.key),
                    ("catalogue", cause.catalogue_id),
                    ("title", cause.title),
                    ("status", cause.status),
                    ("basis", cause.basis),
                    ("rationale", cause.rationale),
                    ("deciding_probe", cause.deciding_probe),
                    ("evidence", links),
                    ("history", history),
                ],
                "id",
                "catalogue",
                "title",
                "status",
                "basis",
            )
        )

    decisions = [
        _drop_empty(
            [
                ("kind", decision.kind),
                ("at", format_timestamp(decision.decided_at)),
                ("by", decision.decided_by),
                ("rationale", decision.rationale),
                ("tradeoff", decision.tradeoff),
                ("fix", decision.fix),
                ("verified", bool(decision.verified)),
                ("revisit_on", decision.revisit_on.isoformat() if decision.revisit_on else None),
                ("triggers", [_trigger(t) for t in decision.revisit_triggers]),
                ("evidence", list(decision.evidence_keys)),
            ],
            "kind",
            "at",
            "rationale",
            "verified",
        )
        for decision in _rows(session, Decision, Decision.incident_id == incident.id)
    ]

    family = []
    family_links = _rows(
        session,
        FamilyLink,
        FamilyLink.from_cause_id.in_(list(cause_rows) or [-1]),  # type: ignore[attr-defined]
    )
    for link in family_links:
        other = session.get(Cause, link.to_cause_id)
        assert other is not None
        other_incident = session.get(Incident, other.incident_id)
        assert other_incident is not None
        family.append(
            _drop_empty(
                [
                    ("cause", cause_rows[link.from_cause_id].key),
                    ("incident", other_incident.slug),
                    ("other_cause", other.key),
                    ("note", link.note),
                ],
                "cause",
                "incident",
                "other_cause",
            )
        )

    symptoms = [
        _drop_empty(
            [
                ("id", row.key),
                ("kind", row.kind),
                ("description", row.description),
                ("observed", dict(row.observed)),
                ("evidence", list(row.evidence_keys)),
            ],
            "id",
            "description",
        )
        for row in _rows(session, Symptom, Symptom.incident_id == incident.id)
    ]
    evidence_records = [
        _drop_empty(
            [
                ("id", row.key),
                ("kind", row.kind),
                ("summary", row.summary),
                ("source", row.source),
                ("recorded_at", format_timestamp(row.recorded_at)),
                ("payload", dict(row.payload)),
            ],
            "id",
            "kind",
            "summary",
            "recorded_at",
        )
        for row in evidence
    ]
    references = [
        _drop_empty([("url", row.url), ("title", row.title), ("note", row.note)])
        for row in _rows(session, Reference, Reference.incident_id == incident.id)
    ]
    record = _drop_empty(
        [
            ("slug", incident.slug),
            ("title", incident.title),
            ("status", incident.status),
            ("opened", incident.opened_on.isoformat()),
            ("closed", incident.closed_on.isoformat() if incident.closed_on else None),
            ("summary", incident.summary),
            ("impact", incident.impact),
            ("stack", stack),
            ("timeline", [_timeline_entry(entry) for entry in incident.timeline]),
            ("symptoms", symptoms),
            ("evidence", evidence_records),
            ("causes", cause_records),
            ("decisions", decisions),
            ("references", references),
            ("family", family),
        ],
        "slug",
        "title",
        "status",
        "opened",
    )
    record["body"] = incident.body
    return record


def list_records(
    session: Session,
    *,
    status: str | None = None,
    cause: str | None = None,
    cause_status: str | None = None,
    model: str | None = None,
) -> list[dict[str, Any]]:
    """Incident summaries, oldest first; filters: incident status, a cause (catalogue id or
    key) optionally with its status, a substring of the model."""
    query = select(Incident).order_by(Incident.opened_on, Incident.slug)  # type: ignore[arg-type]
    if status is not None:
        query = query.where(Incident.status == status)
    if model is not None:
        query = query.where(Incident.model.contains(model))  # type: ignore[attr-defined]
    summaries = []
    for incident in session.exec(query).all():
        causes = _rows(session, Cause, Cause.incident_id == incident.id)
        if cause is not None or cause_status is not None:
            matching = [
                c
                for c in causes
                if (cause is None or cause in (c.key, c.catalogue_id))
                and (cause_status is None or c.status == cause_status)
            ]
            if not matching:
                continue
        decisions = _rows(session, Decision, Decision.incident_id == incident.id)
        summaries.append(
            {
                "slug": incident.slug,
                "title": incident.title,
                "status": incident.status,
                "opened": incident.opened_on.isoformat(),
                "closed": incident.closed_on.isoformat() if incident.closed_on else None,
                "model": incident.model,
                "server_build": incident.server_build,
                "causes": [
                    {"id": c.key, "catalogue": c.catalogue_id, "status": c.status} for c in causes
                ],
                "decision": decisions[-1].kind if decisions else None,
            }
        )
    return summaries


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
    # Write next to the target and rename, so a reader never sees half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)


def export_incident(store: Store, slug: str, out_dir: str | os.PathLike[str]) -> Path:
    """Write one incident to `<out_dir>/<slug>.md`; the path written."""
    with store.session(readonly=True) as session:
        record = load_record(session, slug)
    out = Path(out_dir)
    path = out / f"{slug}.md"
    text = _checked_text(record, path)
    out.mkdir(parents=True, exist_ok=True)
    _write(path, text)
    return path


def export_all(store: Store, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write every stored incident to `<out_dir>/<slug>.md`; the paths written, by slug.

    Every file is rendered and checked before the first one is written.
    """
    with store.session(readonly=True) as session:
        slugs = sorted(session.exec(select(Incident.slug)).all())
        records = [load_record(session, slug) for slug in slugs]
    out = Path(out_dir)
    texts = [(out / f"{r['slug']}.md", _checked_text(r, out / f"{r['slug']}.md")) for r in records]
    out.mkdir(parents=True, exist_ok=True)
    for path, text in texts:
        _write(path, text)
    return [path for path, _text in texts]
