"""What the live proxy (`triage proxy`) stores: recorded exchanges, failure counts over time
windows, and the incidents it opens for a failure signature.

Rows come in batches from the proxy's background writer, already redacted and classified
(kb knows nothing about llama-server or the checks). Every function takes the caller's
session: a batch -- its exchanges, the counts it reads, the incident it may open -- is one
transaction.

Idempotency: each exchange carries a key chosen by the proxy when it happened; inserting a
key that is already stored is a no-op, so a spool replayed twice (a restart between the
insert and the spool truncation) stores each exchange once.

Duplicate incidents: `livesignature` is unique on (model, signature); on PostgreSQL the
opener also takes a transaction-level advisory lock on that key first, so a second replica
waits for the first to commit and then finds its incident instead of failing on the
constraint. SQLite writers are already serialised (BEGIN IMMEDIATE in kb.repo.store).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import func, text
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from kb.domain import family
from kb.domain.errors import StoreError

# The one wording of a live failing count, shared with the retrospective.
from kb.domain.retrotext import failing_text as failing_text
from kb.models import Evidence, Incident, LiveExchange, LiveSignature, Symptom, utcnow
from kb.repo.family import incident_signature
from kb.repo.store import add_evidence_many, get_incident

KEY_SEPARATOR = "\x1f"
# Appended to the signature of failures the client configured in charts and lists.
CONFIGURED_MARK = "(client-configured)"
# The count older proxy versions put at the end of an incident's title.
_TITLE_COUNT = re.compile(r" \(\d+/\d+ failing\)$")
# A decompressed body larger than this is refused (a zip bomb in a hand-edited row).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Failing examples attached to an incident per batch: the first and latest are always kept
# in `livesignature`; the evidence table is not a log of every request.
MAX_EXAMPLES_PER_BATCH = 5
LIVE_COLUMNS = tuple(name for name in LiveExchange.model_fields if name not in ("id",))


# --------------------------------------------------------------------------- bodies


def compress_body(exchange: dict[str, Any]) -> bytes:
    """The stored form of an exchange: zlib-compressed canonical JSON."""
    raw = json.dumps(exchange, sort_keys=True, separators=(",", ":"), default=str).encode()
    return zlib.compress(raw, 6)


def decompress_body(data: bytes | None) -> dict[str, Any] | None:
    """The exchange dict of a stored body (None when the body was sampled out)."""
    if data is None:
        return None
    inflater = zlib.decompressobj()
    raw = inflater.decompress(bytes(data), MAX_BODY_BYTES)
    if inflater.unconsumed_tail:
        raise StoreError(f"stored live exchange body exceeds {MAX_BODY_BYTES} bytes")
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise StoreError("stored live exchange body is not a JSON object")
    return value


# --------------------------------------------------------------------------- exchanges


def insert_exchanges(session: Session, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Store recorded exchanges; keys already stored are skipped. Returns the inserted keys."""
    if not rows:
        return []
    keys = [str(row["key"]) for row in rows]
    if len(set(keys)) != len(keys):
        raise StoreError("a batch of live exchanges repeats an idempotency key")
    existing = set(
        session.exec(select(LiveExchange.key).where(col(LiveExchange.key).in_(keys))).all()
    )
    fresh = [_row_values(row) for row in rows if row["key"] not in existing]
    if not fresh:
        return []
    dialect = session.get_bind().dialect.name
    table = LiveExchange.__table__  # type: ignore[attr-defined]
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    # Another writer may store the same key between the read above and this insert (two
    # processes replaying one spool): the constraint decides, the insert skips.
    statement = insert(table).values(fresh).on_conflict_do_nothing(index_elements=["key"])
    session.execute(statement)
    return [row["key"] for row in fresh]


@functools.lru_cache(maxsize=1)
def _defaults_and_limits() -> tuple[dict[str, Any], dict[str, int]]:
    # Building a model instance per row costs more than the insert itself: once is enough.
    defaults = LiveExchange(key="").model_dump(exclude={"id"})
    limits = {}
    for name, info in LiveExchange.model_fields.items():
        max_length = next((m.max_length for m in info.metadata if hasattr(m, "max_length")), None)
        if max_length:
            limits[name] = int(max_length)
    return defaults, limits


def _row_values(row: dict[str, Any]) -> dict[str, Any]:
    unknown = set(row) - set(LIVE_COLUMNS)
    if unknown:
        raise StoreError(f"live exchange: unknown field(s) {sorted(unknown)}")
    defaults, limits = _defaults_and_limits()
    values = {**defaults, "recorded_at": utcnow(), **row}
    for name, max_length in limits.items():
        if isinstance(values.get(name), str):
            values[name] = values[name][:max_length]
    return values


def load_exchange(session: Session, key: str) -> dict[str, Any] | None:
    """The stored (redacted) exchange dict of one recorded exchange, if its body was kept."""
    row = session.exec(select(LiveExchange).where(LiveExchange.key == key)).first()
    return decompress_body(row.body) if row is not None else None


def count_exchanges(session: Session) -> int:
    return int(session.exec(select(func.count()).select_from(LiveExchange)).one())


# --------------------------------------------------------------------------- counts


@dataclass(frozen=True)
class CellCount:
    """Failures with one signature out of all exchanges of a model x client in a window."""

    model: str
    client: str
    signature: str
    failures: int
    n: int
    # Why these failures are what the client configured ("" for real failures).
    client_limit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cell_counts(session: Session, since: datetime, until: datetime) -> list[CellCount]:
    """Every model x client x failure signature seen in [since, until), with k and n."""
    window = (col(LiveExchange.recorded_at) >= since, col(LiveExchange.recorded_at) < until)
    totals = {
        (model, client): int(n)
        for model, client, n in session.exec(
            select(LiveExchange.model, LiveExchange.client, func.count())
            .where(*window)
            .group_by(LiveExchange.model, LiveExchange.client)
        ).all()
    }
    cells = session.execute(
        sa_select(
            col(LiveExchange.model),
            col(LiveExchange.client),
            col(LiveExchange.signature),
            col(LiveExchange.client_limit),
            func.count(),
        )
        .where(*window, col(LiveExchange.failed).is_(True))
        .group_by(
            LiveExchange.model,
            LiveExchange.client,
            LiveExchange.signature,
            LiveExchange.client_limit,
        )
    ).all()
    return sorted(
        (
            CellCount(model, client, signature, int(k), totals.get((model, client), int(k)), why)
            for model, client, signature, why, k in cells
        ),
        key=lambda c: (c.model, c.client, c.signature, c.client_limit),
    )


def signature_counts(
    session: Session,
    model: str,
    signature: str,
    since: datetime,
    until: datetime,
    shape: str | None = None,
) -> tuple[int, int]:
    """(failures with `signature`, all exchanges) of one model (and request shape, when
    given) in [since, until); failures the client configured are not counted as failures."""
    window: list[Any] = [
        LiveExchange.model == model,
        col(LiveExchange.recorded_at) >= since,
        col(LiveExchange.recorded_at) < until,
    ]
    if shape is not None:
        window.append(LiveExchange.shape == shape)
    n = session.exec(select(func.count()).select_from(LiveExchange).where(*window)).one()
    k = session.exec(
        select(func.count())
        .select_from(LiveExchange)
        .where(*window, LiveExchange.signature == signature, LiveExchange.client_limit == "")
    ).one()
    return int(k), int(n)


@dataclass(frozen=True)
class ShapeCounts:
    """All exchanges of one model x request shape in a window, and its failures by
    signature: those the client configured (its own max_tokens or stop list) apart."""

    n: int
    failures: dict[str, int]
    configured: dict[str, int]


def shape_counts(
    session: Session, model: str, shape: str, since: datetime, until: datetime
) -> ShapeCounts:
    """The exchanges of `model` with request shape `shape` in [since, until)."""
    window = (
        LiveExchange.model == model,
        LiveExchange.shape == shape,
        col(LiveExchange.recorded_at) >= since,
        col(LiveExchange.recorded_at) < until,
    )
    n = session.exec(select(func.count()).select_from(LiveExchange).where(*window)).one()
    failures: dict[str, int] = {}
    configured: dict[str, int] = {}
    for signature, why, k in session.exec(
        select(LiveExchange.signature, LiveExchange.client_limit, func.count())
        .where(*window, col(LiveExchange.failed).is_(True))
        .group_by(LiveExchange.signature, LiveExchange.client_limit)
    ).all():
        into = configured if why else failures
        into[signature] = into.get(signature, 0) + int(k)
    return ShapeCounts(int(n), failures, configured)


def series(
    session: Session, since: datetime, until: datetime, bucket: timedelta
) -> list[dict[str, Any]]:
    """Per time bucket and model x signature: failures and all exchanges (for charts)."""
    rows = session.execute(
        sa_select(
            col(LiveExchange.recorded_at),
            col(LiveExchange.model),
            col(LiveExchange.signature),
            col(LiveExchange.client_limit),
        )
        .where(col(LiveExchange.recorded_at) >= since, col(LiveExchange.recorded_at) < until)
        .order_by(col(LiveExchange.recorded_at))
    ).all()
    width = max(bucket.total_seconds(), 1.0)
    totals: dict[tuple[int, str], int] = {}
    failures: dict[tuple[int, str, str], int] = {}
    for recorded_at, model, signature, why in rows:
        slot = int((_naive(recorded_at) - _naive(since)).total_seconds() // width)
        totals[(slot, model)] = totals.get((slot, model), 0) + 1
        if signature and why:
            signature = f"{signature} {CONFIGURED_MARK}"
        if signature:
            failures[(slot, model, signature)] = failures.get((slot, model, signature), 0) + 1
    out = []
    for (slot, model, signature), k in sorted(failures.items()):
        out.append(
            {
                "bucket": _naive(since) + timedelta(seconds=slot * width),
                "model": model,
                "signature": signature,
                "failures": k,
                "n": totals[(slot, model)],
            }
        )
    return out


def _naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None)


def latest_upstream(session: Session) -> dict[str, Any] | None:
    """The upstream identity of the most recent recorded exchange."""
    row = session.exec(
        select(LiveExchange).order_by(
            col(LiveExchange.recorded_at).desc(), col(LiveExchange.id).desc()
        )
    ).first()
    if row is None:
        return None
    return {
        "model": row.model,
        "build": row.upstream_build,
        "template_sha256": row.template_sha256,
        "recorded_at": row.recorded_at,
        "replica": row.replica,
    }


# --------------------------------------------------------------------------- incidents


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


def _observed(signature: str, detection: dict[str, Any]) -> dict[str, Any]:
    """A live symptom's `observed`: the problem's failing k/n with the time it holds for."""
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
    detection: dict[str, Any],
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
    session: Session,
    *,
    model: str,
    signature: str,
    kinds: Iterable[str],
    title: str,
    summary: str,
    upstream: dict[str, Any],
    detection: dict[str, Any],
    examples: Sequence[dict[str, Any]],
    opened_by: str,
    today: date | None = None,
    shape: str = "",
    problem: str = "",
) -> tuple[LiveSignature, bool]:
    """The signature's incident: opened with its rate, first and latest examples and the
    upstream identity, or (when a replica opened it first) the existing one.

    Returns (signature row, opened_now). `examples`: evidence items (kind `exchange`)
    ordered oldest first, each with `live_key` in its payload. `problem` (with `shape`):
    the problem the incident tracks; further signatures of it become its variants
    (`add_variant`).
    """
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
        title=title,
        opened_on=today,
        status="open",
        summary=summary,
        model=model[:300],
        server_build=str(upstream.get("build") or "")[:100],
        stack={"upstream": upstream},
        timeline=[{"at": utcnow().isoformat(), "event": f"opened by {opened_by}: {summary}"}],
    )
    session.add(incident)
    session.flush()
    assert incident.id is not None
    _add_symptoms(session, incident.id, kinds, signature, detection)
    live = LiveSignature(
        key=signature_key(model, signature, shape),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=opened_by,
        detection=detection,
        problem=problem[:300],
    )
    session.add(live)
    session.flush()
    add_examples(session, live, examples)
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
    session: Session, *, model: str, kinds: Iterable[str], upstream: dict[str, Any]
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
    session: Session,
    *,
    model: str,
    signature: str,
    kinds: Iterable[str],
    title: str,
    summary: str,
    upstream: dict[str, Any],
    detection: dict[str, Any],
    examples: Sequence[dict[str, Any]],
    opened_by: str,
    today: date | None = None,
    shape: str = "",
    problem: str = "",
) -> tuple[LiveSignature, str]:
    """The incident for a live failure signature (of `problem`) that just alarmed: the one
    already tracking it (`existing`, examples not added), else an open or parked incident
    of the same family opened by other means (`attached`: the signature, its examples and
    a timeline entry are added to it), else a new one (`opened`, see `open_incident`)."""
    kinds = sorted(set(kinds))
    lock_signature(session, model, problem or signature)
    existing = find_problem(session, model, problem) or find_signature(
        session, model, signature, shape
    )
    if existing is not None:
        return existing, "existing"
    incident = family_match(session, model=model, kinds=kinds, upstream=upstream)
    if incident is None:
        row, opened_now = open_incident(
            session,
            model=model,
            signature=signature,
            kinds=kinds,
            title=title,
            summary=summary,
            upstream=upstream,
            detection=detection,
            examples=examples,
            opened_by=opened_by,
            today=today,
            shape=shape,
            problem=problem,
        )
        return row, "opened" if opened_now else "existing"
    assert incident.id is not None
    row = LiveSignature(
        key=signature_key(model, signature, shape),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=(MATCHED_PREFIX + opened_by)[:100],
        detection=detection,
        problem=problem[:300],
    )
    session.add(row)
    event = f"live failure matched by {opened_by}: {summary}"
    incident.timeline = [*(incident.timeline or []), {"at": utcnow().isoformat(), "event": event}]
    session.add(incident)
    session.flush()
    add_examples(session, row, examples)
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


def _briefed(item: dict[str, Any]) -> dict[str, Any]:
    """An example with its short payload (`brief`, from the proxy) instead of the whole
    exchange, when it has one."""
    if not isinstance(item.get("brief"), dict):
        return item
    return {**item, "payload": item["brief"]}


def add_examples(
    session: Session, live: LiveSignature, examples: Sequence[dict[str, Any]]
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
    rows = add_evidence_many(session, live.incident_id, list(chosen))
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


def update_detection(session: Session, live: LiveSignature, detection: dict[str, Any]) -> None:
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


def live_incidents(session: Session) -> list[dict[str, Any]]:
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
            {
                "slug": incident.slug,
                "title": incident.title,
                "status": incident.status,
                "model": live.model,
                "signature": live.signature,
                "problem": live.problem,
                "variants": [row.signature for row, _ in group],
                "opened_at": live.opened_at,
                "opened_by": live.opened_by,
                "first_exchange": live.first_exchange_key,
                "latest_exchange": max(
                    (row for row, _ in group),
                    key=lambda r: (r.latest_exchange_key != "", r.id or 0),
                ).latest_exchange_key,
                "detection": live.detection,
            }
        )
    out.sort(key=lambda item: (item["opened_at"], item["slug"]), reverse=True)
    return out


def incident_live_counts(
    session: Session, incident_id: int, since: datetime, until: datetime | None = None
) -> tuple[int, int] | None:
    """For a revisit trigger: (failures with the incident's live signatures, all exchanges
    of their models) recorded since `since`; None when the proxy never tracked the incident."""
    signatures = session.exec(
        select(LiveSignature).where(LiveSignature.incident_id == incident_id)
    ).all()
    if not signatures:
        return None
    until = until or utcnow() + timedelta(seconds=1)
    failures = total = 0
    for model in sorted({s.model for s in signatures}):
        n = 0
        for signature in sorted({s.signature for s in signatures if s.model == model}):
            k, n = signature_counts(session, model, signature, since, until)
            failures += k
        total += n
    return failures, total


def first_failing(
    session: Session, model: str, signature: str, since: datetime, shape: str | None = None
) -> tuple[str, datetime, dict[str, Any] | None] | None:
    """The earliest exchange with this failure signature (and request shape, when given)
    since `since`, not counting failures the client configured: key, time, payload."""
    where: list[Any] = [
        LiveExchange.model == model,
        LiveExchange.signature == signature,
        LiveExchange.client_limit == "",
        col(LiveExchange.recorded_at) >= since,
    ]
    if shape is not None:
        where.append(LiveExchange.shape == shape)
    row = session.exec(
        select(LiveExchange)
        .where(*where)
        .order_by(col(LiveExchange.recorded_at), col(LiveExchange.id))
    ).first()
    if row is None:
        return None
    return row.key, row.recorded_at, decompress_body(row.body)
