"""Alembic, driven programmatically: the migrations ship inside the `kb` package."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Engine

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
# Arbitrary constant ("triagemi"): the PostgreSQL session-level advisory lock held while
# the schema is created or upgraded, so processes opening a fresh database at once
# migrate one after the other (two concurrent CREATE TABLEs of the same table collide on
# pg_type_typname_nsp_index).
MIGRATION_LOCK = 0x7472_6961_6765_6D69


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    """The revision this code's schema is at (a single head)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    heads = ScriptDirectory.from_config(config).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads: {sorted(heads)}")
    return str(heads[0])


def sqlite_path(engine: Engine) -> Path | None:
    """The database file of a SQLite engine (None: in memory, or not SQLite)."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser()


@contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    """Hold the database's migration lock: a PostgreSQL advisory lock, or for SQLite an
    exclusive `flock` on `<db file>.lock` beside the database (SQLite's own locks cannot
    span the several transactions of a migration). Where the lock file cannot be created
    (a read-only directory) nobody can migrate, so no lock is needed."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        return
    path = sqlite_path(engine)
    fd = -1
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the flock


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to `revision` under the migration lock; a database already at head is only
    read (no lock, no write), so any number of processes can open it at once."""
    if revision == "head" and current_revision(engine) == head_revision():
        return
    with migration_lock(engine):
        if revision == "head" and current_revision(engine) == head_revision():
            return  # another process migrated while this one waited for the lock
        command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    with migration_lock(engine):
        command.downgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: no schema yet); a read, no write lock."""
    with engine.execution_options(triage_begin="DEFERRED").connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
