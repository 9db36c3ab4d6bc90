"""Bulk loading for benchmark data (tests/bench/datagen.py makes the rows).

Rows are inserted with SQLAlchemy core executemany, per table, in one transaction per
batch, into a database at revision 0001_initial: without the search and signature
triggers of 0002_search, so a million evidence rows do not rewrite a search document a
million times. Upgrading to head afterwards builds the search index and the signature
rows set-based (the same path a real database with history takes), then the signatures
are computed and the planner statistics refreshed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text
from sqlmodel import SQLModel

import kb.models  # noqa: F401  (registers the tables)
from kb.domain.errors import StoreError
from kb.repo.family import refresh_signatures
from kb.repo.migrate import current_revision
from kb.repo.store import Store
from kb.vocab import Vocabulary

# Insert order (foreign keys); a batch maps each name to its rows (explicit ids).
TABLES = (
    "incident",
    "evidence",
    "symptom",
    "cause",
    "causestatuschange",
    "evidencelink",
    "familylink",
    "decision",
)
BASE_REVISION = "0001_initial"
Batch = dict[str, list[dict[str, Any]]]


def empty_batch() -> Batch:
    return {name: [] for name in TABLES}


def load(
    store: Store,
    batches: Iterable[Batch],
    *,
    progress: Callable[[str], None] | None = None,
    vocabulary: Vocabulary | None = None,
) -> dict[str, float]:
    """Load `batches` into an empty database, then index it; seconds spent per phase.
    `vocabulary` (the catalogue's numbers) gives the signature masks their bits."""
    say = progress or (lambda _message: None)
    revision = current_revision(store.engine)
    if revision not in (None, BASE_REVISION):
        raise StoreError(f"bench data needs an empty database (found revision {revision})")
    store.upgrade(BASE_REVISION)
    tables = SQLModel.metadata.tables
    timings: dict[str, float] = {}
    started = time.perf_counter()
    rows = 0
    for number, batch in enumerate(batches, 1):
        with store.engine.begin() as conn:
            for name in TABLES:
                if batch.get(name):
                    conn.execute(insert(tables[name]), batch[name])
                    rows += len(batch[name])
        if number % 10 == 0:
            say(f"  loaded {rows:,} rows ({time.perf_counter() - started:.0f} s)")
    if store.dialect == "postgresql":
        with store.engine.begin() as conn:
            for name in TABLES:
                if "id" in tables[name].c:
                    conn.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                            f"coalesce((SELECT max(id) FROM {name}), 0) + 1, false)"
                        )
                    )
    timings["insert_s"] = time.perf_counter() - started
    say(f"  inserted {rows:,} rows in {timings['insert_s']:.0f} s; building the search index")

    started = time.perf_counter()
    store.upgrade("head")
    timings["index_s"] = time.perf_counter() - started
    say(f"  search index and signature rows in {timings['index_s']:.0f} s")

    started = time.perf_counter()
    with store.session() as session:
        refresh_signatures(session, batch=5000, vocabulary=vocabulary)
    timings["signatures_s"] = time.perf_counter() - started
    say(f"  signatures in {timings['signatures_s']:.0f} s")

    started = time.perf_counter()
    optimize(store)
    timings["analyze_s"] = time.perf_counter() - started
    return timings


def optimize(store: Store) -> None:
    """Merge the FTS5 index segments and refresh planner statistics (after a bulk load)."""
    if store.dialect == "sqlite":
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO incidentsearch (incidentsearch) VALUES ('optimize')"))
            conn.execute(text("ANALYZE"))
        return
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def database_size(store: Store) -> int:
    """Bytes on disk of the database (SQLite file plus WAL, or the PostgreSQL database)."""
    if store.dialect == "sqlite":
        path = Path(store.url.split("///", 1)[1])
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def server_version(store: Store) -> str:
    with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            return "SQLite " + str(conn.execute(text("SELECT sqlite_version()")).scalar_one())
        version = str(conn.execute(text("SHOW server_version")).scalar_one())
        return "PostgreSQL " + version.split(" ", 1)[0]
