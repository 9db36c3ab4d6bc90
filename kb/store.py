"""Engine, sessions and the write helpers every part of the product goes through.

SQLite by default (a file in the data directory), any SQLAlchemy URL via
`TRIAGE_DATABASE_URL` (PostgreSQL for a team). The schema is created and upgraded by
Alembic, never by `metadata.create_all`, so SQLite and PostgreSQL follow the same path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, func
from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, create_engine, select

from kb.models import (
    CAUSE_STATUSES,
    EVIDENCE_KINDS,
    Cause,
    CauseStatusChange,
    Evidence,
    Incident,
    utcnow,
)

SQLITE_BUSY_TIMEOUT_MS = 30_000


class StoreError(Exception):
    """A write that the knowledge base refuses; the message names what is wrong."""


def data_dir() -> Path:
    """Where the default SQLite file and run logs live (`TRIAGE_HOME` overrides)."""
    env = os.environ.get("TRIAGE_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "triage"


def database_url(url: str | None = None) -> str:
    """The URL to use: explicit, else `TRIAGE_DATABASE_URL`, else the default SQLite file."""
    if url:
        return url
    env = os.environ.get("TRIAGE_DATABASE_URL")
    if env:
        return env
    return f"sqlite:///{data_dir() / 'triage.db'}"


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Run on every new DBAPI connection of the pool, not once.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
    # Let SQLAlchemy emit BEGIN itself (see _sqlite_begin) instead of pysqlite's deferred one.
    dbapi_connection.isolation_level = None


def _sqlite_begin(conn: Any) -> None:
    # Writers take the lock up front, so two writers queue on busy_timeout instead of one
    # failing with "database is locked" when it upgrades a read lock. Read-only sessions
    # use a deferred BEGIN and never wait for writers (WAL).
    mode = conn.get_execution_options().get("triage_begin", "IMMEDIATE")
    conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str) -> Engine:
    """An engine with the per-connection settings the store relies on."""
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:")
        if not in_memory:
            path = url.split("///", 1)[1] if "///" in url else ""
            if path:
                Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
        if in_memory:
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True)


class Store:
    """The knowledge base: one engine, transactional sessions, migrations applied on open."""

    def __init__(self, url: str | None = None, *, migrate: bool = True) -> None:
        self.url = database_url(url)
        self.engine = make_engine(self.url)
        if migrate:
            self.upgrade()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self, revision: str = "head") -> None:
        """Apply Alembic migrations up to `revision`."""
        from kb.migrate import upgrade

        upgrade(self.engine, revision)

    def downgrade(self, revision: str = "base") -> None:
        from kb.migrate import downgrade

        downgrade(self.engine, revision)

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back on any exception."""
        bind = self.engine.execution_options(triage_begin="DEFERRED") if readonly else self.engine
        with Session(bind, expire_on_commit=False) as session:
            with session.begin():
                yield session

    def close(self) -> None:
        self.engine.dispose()


def get_incident(session: Session, slug: str) -> Incident | None:
    return session.exec(select(Incident).where(Incident.slug == slug)).first()


def require_incident(session: Session, slug: str) -> Incident:
    incident = get_incident(session, slug)
    if incident is None:
        raise StoreError(f"no incident with slug {slug!r}")
    return incident


def record_status_change(
    session: Session,
    cause: Cause,
    to_status: str,
    *,
    actor: str,
    rationale: str,
    evidence_keys: list[str] | None = None,
    at: datetime | None = None,
) -> CauseStatusChange:
    """Set a cause's status and append the history row; the only way a status changes."""
    if to_status not in CAUSE_STATUSES:
        raise StoreError(f"unknown cause status {to_status!r} (expected one of {CAUSE_STATUSES})")
    if not actor.strip():
        raise StoreError("a status change needs an actor")
    if not rationale.strip():
        raise StoreError("a status change needs a rationale")
    if cause.id is None:
        session.add(cause)
        session.flush()
    assert cause.id is not None
    keys = list(evidence_keys or [])
    if keys:
        known = set(
            session.exec(
                select(Evidence.key).where(
                    Evidence.incident_id == cause.incident_id, Evidence.key.in_(keys)  # type: ignore[attr-defined]
                )
            ).all()
        )
        missing = [k for k in keys if k not in known]
        if missing:
            raise StoreError(f"cause {cause.key!r}: unknown evidence id(s) {missing}")
    history = session.exec(
        select(func.count()).select_from(CauseStatusChange).where(
            CauseStatusChange.cause_id == cause.id
        )
    ).one()
    change = CauseStatusChange(
        cause_id=cause.id,
        from_status=cause.status if history else None,
        to_status=to_status,
        changed_at=at or utcnow(),
        actor=actor,
        rationale=rationale,
        evidence_keys=keys,
    )
    cause.status = to_status
    session.add(cause)
    session.add(change)
    session.flush()
    return change


def next_evidence_key(session: Session, incident_id: int | None, prefix: str = "E") -> str:
    """The next free `E<n>` key of an incident."""
    return f"{prefix}{_next_evidence_number(session, incident_id, prefix)}"


def _next_evidence_number(session: Session, incident_id: int | None, prefix: str = "E") -> int:
    if incident_id is not None:
        # Two writers numbering one incident's evidence at once would both pick the same
        # key on PostgreSQL (READ COMMITTED): lock the incident row (FOR NO KEY UPDATE, as
        # the search triggers of migration 0002 do) so the second waits for the first to
        # commit and then sees its key. SQLite writers are already serialised.
        session.exec(
            select(Incident.id).where(Incident.id == incident_id).with_for_update(key_share=True)
        ).first()
    rows = session.exec(
        select(Evidence.key).where(
            Evidence.incident_id == incident_id if incident_id is not None
            else Evidence.incident_id.is_(None)  # type: ignore[union-attr]
        )
    ).all()
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    numbers = [int(m.group(1)) for k in rows if (m := pattern.match(k))]
    return max(numbers, default=0) + 1


def add_evidence(
    session: Session,
    *,
    incident_id: int | None,
    kind: str,
    summary: str,
    payload: dict[str, Any] | None = None,
    source: str = "",
    key: str | None = None,
    run_id: int | None = None,
    recorded_at: datetime | None = None,
) -> Evidence:
    """Store one piece of evidence (auto key `E<n>` unless given)."""
    _check_evidence(kind, summary)
    evidence = Evidence(
        incident_id=incident_id,
        key=key or next_evidence_key(session, incident_id),
        kind=kind,
        summary=summary,
        payload=payload or {},
        source=source,
        run_id=run_id,
        recorded_at=recorded_at or utcnow(),
    )
    session.add(evidence)
    session.flush()
    return evidence


def _check_evidence(kind: str, summary: str) -> None:
    if kind not in EVIDENCE_KINDS:
        raise StoreError(f"unknown evidence kind {kind!r} (expected one of {EVIDENCE_KINDS})")
    if not summary.strip():
        raise StoreError("evidence needs a summary")


def add_evidence_many(
    session: Session,
    incident_id: int | None,
    items: list[dict[str, Any]],
    *,
    run_id: int | None = None,
) -> list[Evidence]:
    """Store several pieces of evidence with consecutive `E<n>` keys, numbering once (a probe
    run records hundreds of replies; numbering each one rescans the incident's keys).
    Each item: kind, summary, and optionally payload, source, recorded_at."""
    for item in items:
        _check_evidence(item["kind"], item["summary"])
    if not items:
        return []
    first = _next_evidence_number(session, incident_id)
    rows = [
        Evidence(
            incident_id=incident_id,
            key=f"E{first + offset}",
            kind=item["kind"],
            summary=item["summary"],
            payload=item.get("payload") or {},
            source=item.get("source", ""),
            run_id=run_id,
            recorded_at=item.get("recorded_at") or utcnow(),
        )
        for offset, item in enumerate(items)
    ]
    session.add_all(rows)
    session.flush()
    return rows


def evidence_by_keys(session: Session, incident_id: int, keys: list[str]) -> dict[str, Evidence]:
    rows = session.exec(
        select(Evidence).where(
            Evidence.incident_id == incident_id, Evidence.key.in_(keys)  # type: ignore[attr-defined]
        )
    ).all()
    return {row.key: row for row in rows}
