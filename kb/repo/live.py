"""What the live proxy (`triage proxy`) stores: recorded exchanges and failure counts over
time windows (the incidents it opens for a failure signature: kb.repo.liveincidents).

Rows come in batches from the proxy's background writer, already redacted and classified
(kb knows nothing about llama-server or the checks). Every function takes the caller's
session: a batch -- its exchanges, the counts it reads, the incident it may open -- is one
transaction.

Idempotency: each exchange carries a key chosen by the proxy when it happened; inserting a
key that is already stored is a no-op, so a spool replayed twice (a restart between the
insert and the spool truncation) stores each exchange once.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import func
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from kb.domain.errors import StoreError
from kb.domain.live import LiveRow
from kb.jsontypes import JsonObject
from kb.models import LiveExchange, LiveSignature, utcnow

KEY_SEPARATOR = "\x1f"
# Appended to the signature of failures the client configured in charts and lists.
CONFIGURED_MARK = "(client-configured)"
# A decompressed body larger than this is refused (a zip bomb in a hand-edited row).
MAX_BODY_BYTES = 16 * 1024 * 1024
LIVE_COLUMNS = tuple(name for name in LiveExchange.model_fields if name not in ("id",))


# --------------------------------------------------------------------------- bodies


def compress_body(exchange: JsonObject) -> bytes:
    """The stored form of an exchange: zlib-compressed canonical JSON."""
    raw = json.dumps(exchange, sort_keys=True, separators=(",", ":"), default=str).encode()
    return zlib.compress(raw, 6)


def decompress_body(data: bytes | None) -> JsonObject | None:
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


def insert_exchanges(session: Session, rows: Sequence[LiveRow]) -> list[str]:
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
def _defaults_and_limits() -> tuple[LiveRow, dict[str, int]]:
    # Building a model instance per row costs more than the insert itself: once is enough.
    defaults = cast(LiveRow, LiveExchange(key="").model_dump(exclude={"id"}))
    limits = {}
    for name, info in LiveExchange.model_fields.items():
        max_length = next((m.max_length for m in info.metadata if hasattr(m, "max_length")), None)
        if max_length:
            limits[name] = int(max_length)
    return defaults, limits


def _row_values(row: LiveRow) -> LiveRow:
    """The row to insert: a column missing from `row` gets its default, text its limit."""
    unknown = set(row) - set(LIVE_COLUMNS)
    if unknown:
        raise StoreError(f"live exchange: unknown field(s) {sorted(unknown)}")
    defaults, limits = _defaults_and_limits()
    values: dict[str, object] = {**defaults, "recorded_at": utcnow(), **row}
    for name, max_length in limits.items():
        value = values.get(name)
        if isinstance(value, str):
            values[name] = value[:max_length]
    return cast(LiveRow, values)


def load_exchange(session: Session, key: str) -> JsonObject | None:
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

    def to_dict(self) -> JsonObject:
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


@dataclass(frozen=True)
class SeriesPoint:
    """Failures with one signature out of all exchanges of a model in one time bucket."""

    bucket: datetime  # the bucket's start (naive UTC)
    model: str
    signature: str  # CONFIGURED_MARK appended for failures the client configured
    failures: int
    n: int


def series(
    session: Session, since: datetime, until: datetime, bucket: timedelta
) -> list[SeriesPoint]:
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
    return [
        SeriesPoint(
            bucket=_naive(since) + timedelta(seconds=slot * width),
            model=model,
            signature=signature,
            failures=k,
            n=totals[(slot, model)],
        )
        for (slot, model, signature), k in sorted(failures.items())
    ]


def _naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None)


@dataclass(frozen=True)
class Upstream:
    """The upstream server as of the latest recorded live exchange."""

    model: str
    build: str
    template_sha256: str
    recorded_at: datetime
    replica: str


def latest_upstream(session: Session) -> Upstream | None:
    """The upstream identity of the most recent recorded exchange."""
    row = session.exec(
        select(LiveExchange).order_by(
            col(LiveExchange.recorded_at).desc(), col(LiveExchange.id).desc()
        )
    ).first()
    if row is None:
        return None
    return Upstream(
        model=row.model,
        build=row.upstream_build,
        template_sha256=row.template_sha256,
        recorded_at=row.recorded_at,
        replica=row.replica,
    )


# --------------------------------------------------------------------------- incidents


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
) -> tuple[str, datetime, JsonObject | None] | None:
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
