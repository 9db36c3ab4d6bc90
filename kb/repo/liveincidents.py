"""The incidents the live proxy opens for a failure signature: find or open one per
(model, signature), attach a failing variant, match an incident opened by other means
(kb.domain.family's similarity), keep a few failing examples as evidence, and the list the
Live page shows. Exchanges and their counts are in kb.repo.live.

Duplicate incidents: `livesignature` is unique on (model, signature); on PostgreSQL the
opener also takes a transaction-level advisory lock on that key first, so a second replica
waits for the first to commit and then finds its incident instead of failing on the
constraint. SQLite writers are already serialised (BEGIN IMMEDIATE in kb.repo.store).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy import func, text
from sqlmodel import Session, col, select

from kb.domain import family
from kb.domain.live import DetectionFacts, LiveAlarm, LiveExample
from kb.jsontypes import JsonObject
from kb.models import Evidence, Incident, LiveSignature, Symptom, utcnow
from kb.repo.family import incident_signature
from kb.repo.live import KEY_SEPARATOR
from kb.repo.store import EvidenceItem, add_evidence_many, get_incident

__all__ = [
    "MATCHED_PREFIX",
    "LiveIncident",
    "add_examples",
    "add_variant",
    "family_match",
    "find_problem",
    "find_signature",
    "live_incidents",
    "lock_signature",
    "open_incident",
    "open_or_attach",
    "signature_key",
    "update_detection",
]

# The count older proxy versions put at the end of an incident's title.
_TITLE_COUNT = re.compile(r" \(\d+/\d+ failing\)$")

# Failing examples attached to an incident per batch: the first and latest are always kept
# in `livesignature`; the evidence table is not a log of every request.
MAX_EXAMPLES_PER_BATCH = 5


def signature_key(model: str, signature: str, shape: str = "") -> str:
    base = f"{model}{KEY_SEPARATOR}{signature}"
    return f"{base}{KEY_SEPARATOR}{shape}" if shape else base


def find_signature(
    session: Session, model: str, signature: str, shape: str = ""
) -> LiveSignature | None:
    key = signature_key(model, signature, shape)
    return session.exec(select(LiveSignature).where(LiveSignature.key == key)).first()


def find_problem(session: Session, model: str, problem: str) -> LiveSignature | None:
    """The first signature row of a problem (its incident's; the problem's detection)."""
    if not problem:
        return None
    return session.exec(
        select(LiveSignature)
        .where(LiveSignature.model == model, LiveSignature.problem == problem)
        .order_by(col(LiveSignature.id))
    ).first()


def lock_signature(session: Session, model: str, signature: str) -> None:
    """Serialise openers of one signature (or problem) across replicas (PostgreSQL advisory
    lock, held until the transaction ends). SQLite needs none: its writers already queue."""
    if session.get_bind().dialect.name != "postgresql":
        return
    digest = hashlib.sha256(signature_key(model, signature).encode()).digest()
    lock_id = int.from_bytes(digest[:8], "big", signed=True)
    session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})


def _slug(text_value: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text_value.lower()).strip("-")
    return slug[:limit].strip("-") or "unknown"


def _free_slug(session: Session, base: str) -> str:
    slug, n = base, 1
    while get_incident(session, slug) is not None:
        n += 1
        slug = f"{base}-{n}"
    return slug


def _observed(signature: str, detection: DetectionFacts | JsonObject) -> JsonObject:
    """A live symptom's `observed` (as stored in its JSON column): the problem's failing k/n
    with the time it holds for."""
    rate = detection.get("rate") or {}
    window = detection.get("window_minutes")
    return {
        "signature": signature,
        **rate,
        **({"window_minutes": window} if window else {}),
        **({"as_of": detection["as_of"]} if "as_of" in detection else {}),
    }


def _add_symptoms(
    session: Session,
    incident_id: int,
    kinds: Iterable[str],
    signature: str,
    detection: DetectionFacts | JsonObject,
) -> None:
    """A symptom row per failing kind the incident does not list yet."""
    have = set(session.exec(select(Symptom.key).where(Symptom.incident_id == incident_id)).all())
    for kind in sorted(set(kinds) - have):
        session.add(
            Symptom(
                incident_id=incident_id,
                key=kind,
                kind=kind,
                description=f"{kind} in live traffic ({signature})",
                observed=_observed(signature, detection),
            )
        )


def open_incident(
    session: Session, alarm: LiveAlarm, *, today: date | None = None
) -> tuple[LiveSignature, bool]:
    """The alarm's incident: opened with its rate, first and latest examples and the
    upstream identity, or (when a replica opened it first) the existing one.

    Returns (signature row, opened_now). `alarm.examples`: evidence items (kind `exchange`)
    ordered oldest first, each with `live_key` in its payload. `alarm.problem` (with
    `alarm.shape`): the problem the incident tracks; further signatures of it become its
    variants (`add_variant`).
    """
    model, signature, shape, problem = alarm.model, alarm.signature, alarm.shape, alarm.problem
    lock_signature(session, model, problem or signature)
    existing = find_problem(session, model, problem) or find_signature(
        session, model, signature, shape
    )
    if existing is not None:
        return existing, False
    today = today or utcnow().date()
    named = problem.partition("@")[0].partition("|")[0] if problem else signature
    slug = _free_slug(session, f"{today.isoformat()}-live-{_slug(model, 60)}-{_slug(named, 80)}")
    incident = Incident(
        slug=slug,
        title=alarm.title,
        opened_on=today,
        status="open",
        summary=alarm.summary,
        model=model[:300],
        server_build=str(alarm.upstream.get("build") or "")[:100],
        stack={"upstream": alarm.upstream},
        timeline=[
            {"at": utcnow().isoformat(), "event": f"opened by {alarm.opened_by}: {alarm.summary}"}
        ],
    )
    session.add(incident)
    session.flush()
    assert incident.id is not None
    _add_symptoms(session, incident.id, alarm.kinds, signature, alarm.detection)
    live = LiveSignature(
        key=signature_key(model, signature, shape),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=alarm.opened_by,
        detection=dict(alarm.detection),
        problem=problem[:300],
    )
    session.add(live)
    session.flush()
    add_examples(session, live, alarm.examples)
    return live, True


def add_variant(
    session: Session,
    first: LiveSignature,
    *,
    signature: str,
    kinds: Iterable[str],
    shape: str,
    opened_by: str,
) -> LiveSignature:
    """Record another symptom set (`signature`) of the problem `first` tracks on the same
    incident: a signature row, symptoms for kinds not listed yet and a timeline entry.
    Returns the existing row when the variant is already recorded."""
    existing = find_signature(session, first.model, signature, shape)
    if existing is not None:
        return existing
    row = LiveSignature(
        key=signature_key(first.model, signature, shape),
        model=first.model,
        signature=signature,
        incident_id=first.incident_id,
        opened_by=first.opened_by if first.opened_by.startswith(MATCHED_PREFIX) else opened_by,
        detection=dict(first.detection),
        problem=first.problem,
    )
    session.add(row)
    _add_symptoms(session, first.incident_id, kinds, signature, first.detection)
    incident = session.get(Incident, first.incident_id)
    if incident is not None:
        event = f"variant of the same problem seen by {opened_by}: {signature}"
        incident.timeline = [
            *(incident.timeline or []),
            {"at": utcnow().isoformat(), "event": event},
        ]
        session.add(incident)
    session.flush()
    return row


# Statuses of an incident still being worked on: live failures of the same family add
# evidence to it instead of opening another.
MATCHABLE_STATUSES = ("open", "parked", "reopened")

# `opened_by` of a signature row that attached to an incident opened by other means.
MATCHED_PREFIX = "matched:"

MAX_MATCH_CANDIDATES = 200


def family_match(
    session: Session, *, model: str, kinds: Iterable[str], upstream: JsonObject
) -> Incident | None:
    """The open or parked incident, opened by other means than the proxy (a capture, a
    diagnosis, by hand), that a live failure is the same failure as -- kb.domain.family's matching:

    - the incident's symptoms include every failing kind of the live signature;
    - its model family (from its stack: model, weights) is the live model's, both known;
    - its status is open, parked or reopened, and no proxy opened it;

    among those, the most similar by `kb.domain.family.similarity` (kinds, build, ...), then the
    newest. A different build does not prevent a match: a parked incident waits for
    exactly that evidence (its "failures in new captures" trigger)."""
    wanted = sorted({kind for kind in kinds if kind})
    query = family.signature(
        wanted, [], {"model": model, "server_build": str(upstream.get("build") or "")}
    )
    if not wanted or not query.model_family:
        return None
    statement = select(Incident).where(col(Incident.status).in_(MATCHABLE_STATUSES))
    for kind in wanted:
        having = select(Symptom.incident_id).where(Symptom.kind == kind)
        statement = statement.where(col(Incident.id).in_(having))
    proxy_opened = select(LiveSignature.incident_id).where(
        ~col(LiveSignature.opened_by).startswith(MATCHED_PREFIX)
    )
    statement = statement.where(col(Incident.id).not_in(proxy_opened))
    statement = statement.order_by(col(Incident.id).desc()).limit(MAX_MATCH_CANDIDATES)
    best: tuple[float, int, Incident] | None = None
    for incident in session.exec(statement).all():
        assert incident.id is not None
        past = incident_signature(session, incident.slug)
        if past.model_family != query.model_family:
            continue
        ranked = (family.similarity(query, past), incident.id, incident)
        if best is None or ranked[:2] > best[:2]:
            best = ranked
    return best[2] if best is not None else None


def open_or_attach(
    session: Session, alarm: LiveAlarm, *, today: date | None = None
) -> tuple[LiveSignature, str]:
    """The incident for a live failure signature (of `alarm.problem`) that just alarmed: the
    one already tracking it (`existing`, examples not added), else an open or parked incident
    of the same family opened by other means (`attached`: the signature, its examples and
    a timeline entry are added to it), else a new one (`opened`, see `open_incident`)."""
    model, signature, shape, problem = alarm.model, alarm.signature, alarm.shape, alarm.problem
    lock_signature(session, model, problem or signature)
    existing = find_problem(session, model, problem) or find_signature(
        session, model, signature, shape
    )
    if existing is not None:
        return existing, "existing"
    incident = family_match(session, model=model, kinds=alarm.kinds, upstream=alarm.upstream)
    if incident is None:
        row, opened_now = open_incident(session, alarm, today=today)
        return row, "opened" if opened_now else "existing"
    assert incident.id is not None
    row = LiveSignature(
        key=signature_key(model, signature, shape),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=(MATCHED_PREFIX + alarm.opened_by)[:100],
        detection=dict(alarm.detection),
        problem=problem[:300],
    )
    session.add(row)
    event = f"live failure matched by {alarm.opened_by}: {alarm.summary}"
    incident.timeline = [*(incident.timeline or []), {"at": utcnow().isoformat(), "event": event}]
    session.add(incident)
    session.flush()
    add_examples(session, row, alarm.examples)
    return row, "attached"


# Live exchanges attached to one incident as evidence: the first ones and then no more --
# every failing exchange stays in `liveexchange` (by its key; the signature row keeps the
# latest), so the record and its export stay small (issue 28: 60 KB of YAML).
MAX_EXAMPLES_PER_INCIDENT = 6


def _live_examples(session: Session, incident_id: int) -> int:
    return int(
        session.exec(
            select(func.count())
            .select_from(Evidence)
            .where(
                Evidence.incident_id == incident_id,
                Evidence.kind == "exchange",
                col(Evidence.source).startswith("proxy:"),
            )
        ).one()
    )


def _briefed(item: LiveExample) -> LiveExample:
    """An example with its short payload (`brief`, from the proxy) instead of the whole
    exchange, when it has one."""
    if not isinstance(item.get("brief"), dict):
        return item
    briefed = item.copy()
    briefed["payload"] = item["brief"]
    return briefed


def add_examples(
    session: Session, live: LiveSignature, examples: Sequence[LiveExample]
) -> list[str]:
    """Attach failing exchanges to the signature's incident, up to
    MAX_EXAMPLES_PER_INCIDENT in all (the first ever and the latest are kept in the
    signature row either way), each linked to the symptoms it shows. Returns the new
    evidence keys."""
    if not examples:
        return []
    keys = [str(item.get("payload", {}).get("live_key", "")) for item in examples]
    if not live.first_exchange_key:
        live.first_exchange_key = keys[0]
    live.latest_exchange_key = keys[-1]
    session.add(live)
    room = min(
        MAX_EXAMPLES_PER_BATCH,
        MAX_EXAMPLES_PER_INCIDENT - _live_examples(session, live.incident_id),
    )
    chosen = list(examples)
    if room <= 0:
        session.flush()
        return []
    if len(chosen) > room:
        if room == 1:
            chosen = chosen[:1]
        else:
            # The oldest and the newest, and evenly spaced ones between.
            step = (len(chosen) - 1) / (room - 1)
            chosen = [chosen[round(i * step)] for i in range(room)]
    if _live_examples(session, live.incident_id):
        chosen = [_briefed(item) for item in chosen]
    else:  # the incident's first example is kept whole; the others refer to theirs
        chosen = [chosen[0], *(_briefed(item) for item in chosen[1:])]
    items = [
        EvidenceItem(
            kind=item["kind"],
            summary=item["summary"],
            payload=item.get("payload") or {},
            source=item.get("source", ""),
            recorded_at=item.get("recorded_at"),
        )
        for item in chosen
    ]
    rows = add_evidence_many(session, live.incident_id, items)
    symptoms = session.exec(select(Symptom).where(Symptom.incident_id == live.incident_id)).all()
    for symptom in symptoms:
        linked = [
            row.key
            for row, item in zip(rows, chosen, strict=True)
            if symptom.kind in (item.get("payload", {}).get("symptoms") or [])
        ]
        if linked:
            symptom.evidence_keys = [*(symptom.evidence_keys or []), *linked]
            session.add(symptom)
    session.flush()
    return [row.key for row in rows]


def update_detection(session: Session, live: LiveSignature, detection: DetectionFacts) -> None:
    """The problem's latest detection (with its `as_of`), also in the incident's live
    symptoms: every number shown for the incident is this one."""
    live.detection = dict(detection)  # reassign: JSON columns changed in place are not saved
    session.add(live)
    incident = session.get(Incident, live.incident_id)
    if incident is not None and not live.opened_by.startswith(MATCHED_PREFIX):
        # A title written with the count at opening ("... (3/11 failing)", before titles
        # carried none) would contradict the latest count: the count goes.
        title = _TITLE_COUNT.sub("", incident.title)
        if title != incident.title:
            incident.title = title
            session.add(incident)
    for symptom in session.exec(select(Symptom).where(Symptom.incident_id == live.incident_id)):
        observed = dict(symptom.observed or {})
        if "signature" in observed and not live.opened_by.startswith(MATCHED_PREFIX):
            symptom.observed = _observed(str(observed["signature"]), detection)
            session.add(symptom)
    session.flush()


@dataclass(frozen=True)
class LiveIncident:
    """An incident the proxy opened or attached to, as the Live page lists it."""

    slug: str
    title: str
    status: str
    model: str
    signature: str  # the first signature recorded for it
    problem: str
    variants: tuple[str, ...]  # every signature (symptom variant) seen for the problem
    opened_at: datetime
    opened_by: str  # the replica, or MATCHED_PREFIX + the replica for an attached one
    first_exchange: str
    latest_exchange: str
    detection: JsonObject  # the problem's latest detection, as stored in its JSON column


def live_incidents(session: Session) -> list[LiveIncident]:
    """The incidents the proxy opened or attached to, newest first, one entry each, with
    the problem's latest detection and every signature (symptom variant) seen for it."""
    rows = session.exec(
        select(LiveSignature, Incident)
        .join(Incident, col(Incident.id) == col(LiveSignature.incident_id))
        .order_by(col(LiveSignature.id))
    ).all()
    by_incident: dict[int, list[tuple[LiveSignature, Incident]]] = {}
    for live, incident in rows:
        by_incident.setdefault(live.incident_id, []).append((live, incident))
    out = []
    for group in by_incident.values():
        live, incident = group[0]
        out.append(
            LiveIncident(
                slug=incident.slug,
                title=incident.title,
                status=incident.status,
                model=live.model,
                signature=live.signature,
                problem=live.problem,
                variants=tuple(row.signature for row, _ in group),
                opened_at=live.opened_at,
                opened_by=live.opened_by,
                first_exchange=live.first_exchange_key,
                latest_exchange=max(
                    (row for row, _ in group),
                    key=lambda r: (r.latest_exchange_key != "", r.id or 0),
                ).latest_exchange_key,
                detection=live.detection,
            )
        )
    out.sort(key=lambda item: (item.opened_at, item.slug), reverse=True)
    return out
