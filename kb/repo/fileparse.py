"""Reading one incident file (`incidents/<slug>.md`): YAML front matter between two `---`
lines, validated by `kb/schemas/incident.schema.json` and the referential checks of
kb.filecheck, then the Markdown narrative; its evidence sidecar joins the front matter's
evidence. Importing and exporting whole folders is kb.repo.files."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match

from kb.domain.retroformat import strip_retro_section
from kb.filecheck import RecordError, _check_plain_data, _check_references
from kb.jsontypes import JsonObject
from kb.repo.fileio import MAX_FILE_BYTES, InputTooLarge, load_yaml, read_bounded
from kb.repo.sidecar import SidecarError, merge_evidence, read_sidecar

__all__ = [
    "FRONT_MATTER_FENCE",
    "INCIDENT_KEYS",
    "SCHEMA_PATH",
    "STACK_KEYS",
    "parse_file",
    "parse_text",
    "schema_message",
    "split_front_matter",
]

SCHEMA_PATH = Path(__file__).parent.parent / "schemas" / "incident.schema.json"

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


@lru_cache(maxsize=1)
def schema_message(error: Any) -> str:
    """A schema error's message without quoting a long value (jsonschema's own text of a
    too-long title repeats all five megabytes of it)."""
    if error.validator == "maxLength" and isinstance(error.instance, str):
        return f"{len(error.instance):,} characters, at most {error.validator_value:,}"
    if len(error.message) > 300:
        return f"{error.message[:150]}...{error.message[-100:]}"
    return str(error.message)


def _validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_format_checker())


def split_front_matter(text: str, file: str) -> tuple[str, str]:
    """(YAML text, Markdown body) of a file's text."""
    if not text.startswith(FRONT_MATTER_FENCE + "\n"):
        raise RecordError(file, "$", "the file must start with a '---' line (YAML front matter)")
    rest = text[len(FRONT_MATTER_FENCE) + 1 :]
    match = re.search(r"^---[ \t]*(?:\n|\Z)", rest, flags=re.MULTILINE)
    if match is None:
        raise RecordError(file, "$", "the front matter has no closing '---' line")
    return rest[: match.start()], rest[match.end() :]


def parse_text(
    text: str,
    file: str = "<text>",
    sidecar: tuple[str, list[JsonObject]] | None = None,
    causes: Collection[str] | None = None,
) -> JsonObject:
    """Parse and validate one incident file's text: the front matter dict plus `body`.

    `causes`: the catalogue's cause ids (kb.filecheck), passed in by the caller.

    `sidecar` is (file name, evidence entries) of its evidence sidecar (kb/sidecar.py):
    the entries join the front matter's evidence and are checked with it; an error in one
    names the sidecar and its line.
    """
    # Universal newlines (a lone CR too), so what export writes reads back the same.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
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
    front_ids = {id(item) for item in data.get("evidence") or [] if isinstance(item, dict)}
    if sidecar is not None and sidecar[1] and isinstance(data.get("evidence") or [], list):
        data["evidence"] = merge_evidence(list(data.get("evidence") or []), sidecar[1])
    try:
        _validate(data, file, causes)
    except RecordError as exc:
        raise _in_sidecar(exc, data, front_ids, sidecar) from None
    stem = Path(file).name.removesuffix(".md") if file.endswith(".md") else None
    if stem is not None and stem != data["slug"]:
        raise RecordError(
            file, "$.slug", f"slug {data['slug']!r} does not match the file name {stem!r}.md"
        )
    record = dict(data)
    # The generated retrospective is derived from the record: not part of it, rewritten on
    # every export (render_record).
    record["body"] = strip_retro_section(body)
    return record


def _validate(data: JsonObject, file: str, causes: Collection[str] | None = None) -> None:
    _check_plain_data(data, file, [])
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        raise RecordError(file, error.json_path, schema_message(error))
    _check_references(data, file, causes)


def _in_sidecar(
    error: RecordError,
    data: JsonObject,
    front_ids: set[int],
    sidecar: tuple[str, list[JsonObject]] | None,
) -> RecordError:
    """An error about a sidecar entry, named by the sidecar file and line."""
    match = re.match(r"^\$\.evidence\[(\d+)\](.*)$", error.json_path)
    if sidecar is None or match is None:
        return error
    item = data["evidence"][int(match.group(1))]
    if id(item) in front_ids:
        return error
    line = next(n for n, entry in enumerate(sidecar[1], start=1) if entry is item)
    return RecordError(sidecar[0], f"line {line}: ${match.group(2)}", error.message)


def parse_file(path: str | os.PathLike[str], causes: Collection[str] | None = None) -> JsonObject:
    """Parse and validate one incident file and its evidence sidecar (see `parse_text`)."""
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
    try:
        side_path, items = read_sidecar(Path(path))
    except SidecarError as exc:
        raise RecordError(exc.file, exc.where, exc.message) from None
    return parse_text(text, name, (str(side_path), items) if side_path else None, causes)
