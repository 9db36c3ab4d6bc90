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
constraint. SQLite writers are already serialised (BEGIN IMMEDIATE in kb.store).
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
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from kb.models import Incident, LiveExchange, LiveSignature, Symptom, utcnow
from kb.store import StoreError, add_evidence_many, get_incident

KEY_SEPARATOR = "\x1f"
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
    cells = session.exec(
        select(LiveExchange.model, LiveExchange.client, LiveExchange.signature, func.count())
        .where(*window, col(LiveExchange.failed).is_(True))
        .group_by(LiveExchange.model, LiveExchange.client, LiveExchange.signature)
    ).all()
    return sorted(
        (
            CellCount(model, client, signature, int(k), totals.get((model, client), int(k)))
            for model, client, signature, k in cells
        ),
        key=lambda c: (c.model, c.client, c.signature),
    )


def signature_counts(
    session: Session, model: str, signature: str, since: datetime, until: datetime
) -> tuple[int, int]:
    """(failures with `signature`, all exchanges) of one model in [since, until)."""
    window = (
        LiveExchange.model == model,
        col(LiveExchange.recorded_at) >= since,
        col(LiveExchange.recorded_at) < until,
    )
    n = session.exec(select(func.count()).select_from(LiveExchange).where(*window)).one()
    k = session.exec(
        select(func.count())
        .select_from(LiveExchange)
        .where(*window, LiveExchange.signature == signature)
    ).one()
    return int(k), int(n)


def series(
    session: Session, since: datetime, until: datetime, bucket: timedelta
) -> list[dict[str, Any]]:
    """Per time bucket and model x signature: failures and all exchanges (for charts)."""
    rows = session.exec(
        select(LiveExchange.recorded_at, LiveExchange.model, LiveExchange.signature)
        .where(col(LiveExchange.recorded_at) >= since, col(LiveExchange.recorded_at) < until)
        .order_by(col(LiveExchange.recorded_at))
    ).all()
    width = max(bucket.total_seconds(), 1.0)
    totals: dict[tuple[int, str], int] = {}
    failures: dict[tuple[int, str, str], int] = {}
    for recorded_at, model, signature in rows:
        slot = int((_naive(recorded_at) - _naive(since)).total_seconds() // width)
        totals[(slot, model)] = totals.get((slot, model), 0) + 1
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


def signature_key(model: str, signature: str) -> str:
    return f"{model}{KEY_SEPARATOR}{signature}"


def find_signature(session: Session, model: str, signature: str) -> LiveSignature | None:
    key = signature_key(model, signature)
    return session.exec(select(LiveSignature).where(LiveSignature.key == key)).first()


def lock_signature(session: Session, model: str, signature: str) -> None:
    """Serialise openers of one signature across replicas (PostgreSQL advisory lock, held
    until the transaction ends). SQLite needs none: its writers already queue."""
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
) -> tuple[LiveSignature, bool]:
    """The signature's incident: opened with its rate, first and latest examples and the
    upstream identity, or (when a replica opened it first) the existing one.

    Returns (signature row, opened_now). `examples`: evidence items (kind `exchange`)
    ordered oldest first, each with `live_key` in its payload.
    """
    lock_signature(session, model, signature)
    existing = find_signature(session, model, signature)
    if existing is not None:
        return existing, False
    today = today or utcnow().date()
    slug = _free_slug(
        session, f"{today.isoformat()}-live-{_slug(model, 60)}-{_slug(signature, 80)}"
    )
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
    for kind in sorted(set(kinds)):
        session.add(
            Symptom(
                incident_id=incident.id,
                key=kind,
                kind=kind,
                description=f"{kind} in live traffic ({signature})",
                observed={"signature": signature, **detection.get("rate", {})},
            )
        )
    live = LiveSignature(
        key=signature_key(model, signature),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=opened_by,
        detection=detection,
    )
    session.add(live)
    session.flush()
    add_examples(session, live, examples)
    return live, True


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
    diagnosis, by hand), that a live failure is the same failure as -- kb.family's matching:

    - the incident's symptoms include every failing kind of the live signature;
    - its model family (from its stack: model, weights) is the live model's, both known;
    - its status is open, parked or reopened, and no proxy opened it;

    among those, the most similar by `kb.family.similarity` (kinds, build, ...), then the
    newest. A different build does not prevent a match: a parked incident waits for
    exactly that evidence (its "failures in new captures" trigger)."""
    from kb import family  # kb.family -> kb.store; imported here to keep kb.live light

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
        past = family.incident_signature(session, incident.slug)
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
) -> tuple[LiveSignature, str]:
    """The incident for a live failure signature that just alarmed: the one already tracking
    it (`existing`, examples not added), else an open or parked incident of the same family
    opened by other means (`attached`: the signature, its examples and a timeline entry
    are added to it), else a new one (`opened`, see `open_incident`)."""
    kinds = sorted(set(kinds))
    lock_signature(session, model, signature)
    existing = find_signature(session, model, signature)
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
        )
        return row, "opened" if opened_now else "existing"
    assert incident.id is not None
    row = LiveSignature(
        key=signature_key(model, signature),
        model=model[:300],
        signature=signature,
        incident_id=incident.id,
        opened_by=(MATCHED_PREFIX + opened_by)[:100],
        detection=detection,
    )
    session.add(row)
    event = f"live failure matched by {opened_by}: {summary}"
    incident.timeline = [*(incident.timeline or []), {"at": utcnow().isoformat(), "event": event}]
    session.add(incident)
    session.flush()
    add_examples(session, row, examples)
    return row, "attached"


def add_examples(
    session: Session, live: LiveSignature, examples: Sequence[dict[str, Any]]
) -> list[str]:
    """Attach failing exchanges to the signature's incident (the first ever and the latest
    are kept in the signature row). Returns the new evidence keys."""
    if not examples:
        return []
    chosen = list(examples)
    if len(chosen) > MAX_EXAMPLES_PER_BATCH:
        # The oldest and the newest, and evenly spaced ones between.
        step = (len(chosen) - 1) / (MAX_EXAMPLES_PER_BATCH - 1)
        chosen = [chosen[round(i * step)] for i in range(MAX_EXAMPLES_PER_BATCH)]
    rows = add_evidence_many(session, live.incident_id, list(chosen))
    keys = [str(item.get("payload", {}).get("live_key", "")) for item in chosen]
    if not live.first_exchange_key:
        live.first_exchange_key = keys[0]
    live.latest_exchange_key = keys[-1]
    session.add(live)
    session.flush()
    return [row.key for row in rows]


def update_detection(session: Session, live: LiveSignature, detection: dict[str, Any]) -> None:
    live.detection = dict(detection)  # reassign: JSON columns changed in place are not saved
    session.add(live)
    session.flush()


def live_incidents(session: Session) -> list[dict[str, Any]]:
    """The incidents the proxy opened or attached to, newest first, with their rate."""
    rows = session.exec(
        select(LiveSignature, Incident)
        .join(Incident, col(Incident.id) == col(LiveSignature.incident_id))
        .order_by(col(LiveSignature.opened_at).desc(), col(LiveSignature.id).desc())
    ).all()
    return [
        {
            "slug": incident.slug,
            "title": incident.title,
            "status": incident.status,
            "model": live.model,
            "signature": live.signature,
            "opened_at": live.opened_at,
            "opened_by": live.opened_by,
            "first_exchange": live.first_exchange_key,
            "latest_exchange": live.latest_exchange_key,
            "detection": live.detection,
        }
        for live, incident in rows
    ]


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
        for live in (s for s in signatures if s.model == model):
            k, n = signature_counts(session, model, live.signature, since, until)
            failures += k
        total += n
    return failures, total


def first_failing(
    session: Session, model: str, signature: str, since: datetime
) -> tuple[str, datetime, dict[str, Any] | None] | None:
    """The earliest exchange with this failure signature since `since`: key, time, payload."""
    row = session.exec(
        select(LiveExchange)
        .where(
            LiveExchange.model == model,
            LiveExchange.signature == signature,
            col(LiveExchange.recorded_at) >= since,
        )
        .order_by(col(LiveExchange.recorded_at), col(LiveExchange.id))
    ).first()
    if row is None:
        return None
    return row.key, row.recorded_at, decompress_body(row.body)
