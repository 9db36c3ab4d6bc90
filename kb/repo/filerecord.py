"""Stored incidents as records: the canonical front-matter dict of one incident, summaries.

Split from kb/files.py (which parses, imports and exports the files); the record is the
shape every reader shares (retro, graph, UI, export).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, datetime, time, timezone
from typing import Any

from sqlmodel import Session, select

from kb.domain.errors import StoreError
from kb.jsontypes import JsonObject
from kb.models import (
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
from kb.repo.store import get_incident

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


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


# --------------------------------------------------------------------------- records


def _drop_empty(pairs: Iterable[tuple[str, Any]], *required: str) -> JsonObject:
    """The canonical rule: optional keys with an empty value are not written.

    Keys the schema requires are always written, even when empty, so that a bad stored
    value shows up as a validation error instead of silently vanishing from the file.
    """
    return {
        key: value for key, value in pairs if key in required or value not in ("", None, [], {})
    }


def _timeline_entry(entry: JsonObject) -> JsonObject:
    return _drop_empty(
        [
            ("at", entry["at"]),
            ("event", entry["event"]),
            ("evidence", list(entry.get("evidence", []))),
        ],
        "at",
        "event",
    )


def _trigger(trigger: JsonObject) -> JsonObject:
    return {"kind": trigger["kind"], **{k: v for k, v in trigger.items() if k != "kind"}}


def _rows(session: Session, model: Any, *where: Any) -> list[Any]:
    return list(session.exec(select(model).where(*where).order_by(model.id)).all())


def _stack_record(incident: Incident) -> JsonObject:
    """The `stack` map: the indexed build columns, then the free-form extras in stored order."""
    stack = _drop_empty(
        [
            ("model", incident.model),
            ("weights", incident.weights),
            ("server_build", incident.server_build),
            ("flags", list(incident.flags)),
        ]
    )
    stack.update(incident.stack)
    return stack


def _evidence_link_record(link: EvidenceLink, evidence_keys: dict[int | None, str]) -> JsonObject:
    return _drop_empty(
        [
            ("id", evidence_keys[link.evidence_id]),
            ("relation", link.relation),
            ("note", link.note),
        ],
        "id",
        "relation",
    )


def _status_change_record(change: CauseStatusChange) -> JsonObject:
    return _drop_empty(
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


def _cause_record(
    session: Session, cause: Cause, evidence_keys: dict[int | None, str]
) -> JsonObject:
    """One cause with its evidence links and status history."""
    links = [
        _evidence_link_record(link, evidence_keys)
        for link in _rows(session, EvidenceLink, EvidenceLink.cause_id == cause.id)
    ]
    history = [
        _status_change_record(change)
        for change in _rows(session, CauseStatusChange, CauseStatusChange.cause_id == cause.id)
    ]
    return _drop_empty(
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


def _decision_record(decision: Decision) -> JsonObject:
    return _drop_empty(
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


def _family_records(session: Session, cause_rows: dict[int | None, Cause]) -> list[JsonObject]:
    """The family links leaving this incident's causes, naming the other incident by slug."""
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
    return family


def _symptom_record(row: Symptom) -> JsonObject:
    return _drop_empty(
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


def _evidence_record(row: Evidence) -> JsonObject:
    return _drop_empty(
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


def _reference_record(row: Reference) -> JsonObject:
    return _drop_empty([("url", row.url), ("title", row.title), ("note", row.note)])


def load_record(session: Session, slug: str) -> JsonObject:
    """The full record of one incident as a plain dict: the canonical front matter + `body`."""
    incident = get_incident(session, slug)
    if incident is None:
        raise StoreError(f"no incident with slug {slug!r}")
    evidence = _rows(session, Evidence, Evidence.incident_id == incident.id)
    evidence_keys = {row.id: row.key for row in evidence}
    causes = _rows(session, Cause, Cause.incident_id == incident.id)
    cause_rows = {row.id: row for row in causes}
    decisions = _rows(session, Decision, Decision.incident_id == incident.id)
    symptoms = _rows(session, Symptom, Symptom.incident_id == incident.id)
    references = _rows(session, Reference, Reference.incident_id == incident.id)
    record = _drop_empty(
        [
            ("slug", incident.slug),
            ("title", incident.title),
            ("status", incident.status),
            ("opened", incident.opened_on.isoformat()),
            ("closed", incident.closed_on.isoformat() if incident.closed_on else None),
            ("summary", incident.summary),
            ("impact", incident.impact),
            ("stack", _stack_record(incident)),
            ("timeline", [_timeline_entry(entry) for entry in incident.timeline]),
            ("symptoms", [_symptom_record(row) for row in symptoms]),
            ("evidence", [_evidence_record(row) for row in evidence]),
            ("causes", [_cause_record(session, cause, evidence_keys) for cause in causes]),
            ("decisions", [_decision_record(decision) for decision in decisions]),
            ("references", [_reference_record(row) for row in references]),
            ("family", _family_records(session, cause_rows)),
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
) -> list[JsonObject]:
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
