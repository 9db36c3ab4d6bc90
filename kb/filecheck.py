"""Checks of an incident record that JSON Schema cannot express (ids, links, history,
dates, plain data), and the error every incident-file check raises. Split from
kb/files.py; `kb.repo.files.RecordError` is the same class."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterable
from datetime import date, datetime
from functools import partial
from typing import Any

from kb.domain.errors import StoreError
from kb.jsontypes import JsonObject
from kb.repo.filerecord import parse_timestamp


class RecordError(StoreError):
    """An incident file the knowledge base refuses: which file, which field, what is wrong."""

    def __init__(self, file: str | os.PathLike[str], json_path: str, message: str) -> None:
        self.file = str(file)
        self.json_path = json_path
        self.message = message
        super().__init__(f"{self.file}: {json_path}: {message}")


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


KnownEvidence = Callable[[list[str], str], None]
"""Checks that every evidence key of a list (at a JSON path) names evidence of the file."""


def _check_references(data: JsonObject, file: str, causes: Collection[str] | None = None) -> None:
    """The checks JSON Schema cannot express: ids, links, history, dates.

    `causes` is the catalogue's full list of cause ids (passed in by triage: kb does not
    know them); None when the caller has no catalogue, and then a cause without a
    `catalogue` field is taken as the catalogue cause of its own id."""
    _check_dates(data, file)
    evidence_ids = _evidence_ids(data, file)
    known: KnownEvidence = partial(_check_known_evidence, evidence_ids, file)
    for index, entry in enumerate(data.get("timeline", [])):
        known(entry.get("evidence", []), f"$.timeline[{index}].evidence")
    _check_symptoms(data, file, known)
    cause_ids: set[str] = set()
    for index, cause in enumerate(data.get("causes", [])):
        path = f"$.causes[{index}]"
        if cause["id"] in cause_ids:
            raise RecordError(file, f"{path}.id", f"duplicate cause id {cause['id']!r}")
        cause_ids.add(cause["id"])
        _check_cause(cause, file, path, evidence_ids, known, causes)
    _check_decisions(data, file, known)
    _check_family(data, file, cause_ids)


def _check_dates(data: JsonObject, file: str) -> None:
    """The slug starts with the opened date; an incident closes no earlier than it opened."""
    slug: str = data["slug"]
    opened = date.fromisoformat(data["opened"])
    if slug[:10] != data["opened"]:
        raise RecordError(
            file, "$.slug", f"slug date {slug[:10]} does not match opened {data['opened']}"
        )
    if data.get("closed") and date.fromisoformat(data["closed"]) < opened:
        raise RecordError(file, "$.closed", f"closed {data['closed']} is before opened")


def _evidence_ids(data: JsonObject, file: str) -> set[str]:
    """The evidence ids of the file, each used once."""
    evidence_ids: set[str] = set()
    for index, item in enumerate(data.get("evidence", [])):
        if item["id"] in evidence_ids:
            raise RecordError(
                file, f"$.evidence[{index}].id", f"duplicate evidence id {item['id']!r}"
            )
        evidence_ids.add(item["id"])
    return evidence_ids


def _check_known_evidence(evidence_ids: set[str], file: str, ids: list[str], path: str) -> None:
    for index, key in enumerate(ids):
        if key not in evidence_ids:
            raise RecordError(file, f"{path}[{index}]", f"no evidence with id {key!r} in this file")


def _check_symptoms(data: JsonObject, file: str, known: KnownEvidence) -> None:
    symptom_ids: set[str] = set()
    for index, symptom in enumerate(data.get("symptoms", [])):
        if symptom["id"] in symptom_ids:
            raise RecordError(
                file, f"$.symptoms[{index}].id", f"duplicate symptom id {symptom['id']!r}"
            )
        symptom_ids.add(symptom["id"])
        known(symptom.get("evidence", []), f"$.symptoms[{index}].evidence")


def _check_cause(
    cause: JsonObject,
    file: str,
    path: str,
    evidence_ids: set[str],
    known: KnownEvidence,
    causes: Collection[str] | None,
) -> None:
    """One cause: its catalogue id, its evidence links and its status history."""
    if causes is not None:
        _check_catalogue(cause, file, path, causes)
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


def _check_catalogue(cause: JsonObject, file: str, path: str, causes: Collection[str]) -> None:
    """A cause is a catalogue cause, or a sub-hypothesis naming the catalogue cause it refines."""
    key = cause["id"]
    catalogue = cause.get("catalogue")
    if key in causes:
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
            f"unknown cause id {key!r}: not a catalogue id ({', '.join(causes)}) "
            "and no `catalogue` field naming the catalogue cause it refines",
        )


def _check_decisions(data: JsonObject, file: str, known: KnownEvidence) -> None:
    for index, decision in enumerate(data.get("decisions", [])):
        path = f"$.decisions[{index}]"
        known(decision.get("evidence", []), f"{path}.evidence")
        revisit = decision.get("revisit_on")
        if revisit and date.fromisoformat(revisit) < parse_timestamp(decision["at"]).date():
            raise RecordError(
                file, f"{path}.revisit_on", f"revisit_on {revisit} is before the decision"
            )


def _check_family(data: JsonObject, file: str, cause_ids: set[str]) -> None:
    """Family links start at a cause of this file, once each; links within it name a cause
    of it other than their own."""
    slug: str = data["slug"]
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


def _check_history(cause: JsonObject, file: str, path: str, known: KnownEvidence) -> None:
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
