"""Database URLs and engines: SQLite by default (a file in the data directory), any
SQLAlchemy URL via `TRIAGE_DATABASE_URL` (PostgreSQL for a team), with the per-connection
settings the store relies on (kb.repo.store opens sessions on these engines)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool
from sqlmodel import create_engine

from kb.domain.errors import StoreError

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "SUPPORTED_SCHEMES",
    "DatabaseURLError",
    "check_url",
    "data_dir",
    "database_url",
    "describe_db_error",
    "make_engine",
    "read_only_requested",
    "redact_url",
    "sqlite_file",
    "sqlite_is_read_only",
]

SQLITE_BUSY_TIMEOUT_MS = 30_000


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


class DatabaseURLError(StoreError, ArgumentError):
    """A database URL the store does not support (also a SQLAlchemyError, so callers that
    catch only those still print one line instead of a traceback)."""


# Dialects (and drivers) the store is built and tested for. A URL naming another one is
# refused by name instead of failing deep inside SQLAlchemy (ModuleNotFoundError: MySQLdb).
SUPPORTED_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")

# Spellings of PostgreSQL without a driver (SQLAlchemy would pick psycopg2, not installed).
_POSTGRES_ALIASES = ("postgresql", "postgres", "postgresql+psycopg3")


def check_url(url: str) -> str:
    """The URL to connect to: supported schemes only; `postgresql://` means psycopg (v3)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise DatabaseURLError(
            f"not a database URL: {redact_url(url)!r} (expected sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB)"
        )
    scheme_lower = scheme.lower()
    if scheme_lower in _POSTGRES_ALIASES:
        return f"postgresql+psycopg://{rest}"
    if scheme_lower not in SUPPORTED_SCHEMES:
        raise DatabaseURLError(
            f"unsupported database URL scheme {scheme!r}: use sqlite or postgresql+psycopg"
        )
    return url


def describe_db_error(exc: BaseException) -> str:
    """One line for a database error: the driver's own message, never the SQL or parameters.

    SQLAlchemy's text of an error carries the statement and its bound parameters (which
    may hold exchange text); PostgreSQL's primary message and SQLite's message do not.
    """
    orig = getattr(exc, "orig", None)
    source = orig if orig is not None else exc
    diag = getattr(source, "diag", None)
    message = getattr(diag, "message_primary", None) or ""
    if not message:
        lines = [
            line.strip()
            for line in str(source).splitlines()
            if line.strip() and not line.lstrip().startswith(("[SQL", "[parameters", "(Background"))
        ]
        message = lines[0] if lines else ""
        # SQLAlchemy's own wrapper text starts with "(driver.Error) ..." -- keep the message.
        message = re.sub(r"^\([\w.]+\)\s*", "", message)
    message = re.sub(r"(://[^:/@\s]+):[^@\s]*@", r"\1:***@", message)  # no passwords
    name = type(source).__name__
    return f"{name}: {message}" if message else name


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


def _sqlite_connect_readonly(dbapi_connection: Any, _record: Any) -> None:
    # A read-only file: no journal mode change (a write), and nothing may write.
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA query_only=ON")
    cursor.close()
    dbapi_connection.isolation_level = None


def _sqlite_begin(conn: Any) -> None:
    # Writers take the lock up front, so two writers queue on busy_timeout instead of one
    # failing with "database is locked" when it upgrades a read lock. Read-only sessions
    # use a deferred BEGIN and never wait for writers (WAL).
    mode = conn.get_execution_options().get("triage_begin", "IMMEDIATE")
    conn.exec_driver_sql(f"BEGIN {mode}")


def _sqlite_begin_deferred(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN DEFERRED")  # a read-only store never takes the write lock


def sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///PATH` URL (None: in memory, or not SQLite)."""
    if not url.startswith("sqlite") or "///" not in url:
        return None
    path = url.split("///", 1)[1].split("?", 1)[0]
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path).expanduser()


def read_only_requested() -> bool:
    """`TRIAGE_READ_ONLY` (set by `triage --read-only`) asks every store to open read-only."""
    return os.environ.get("TRIAGE_READ_ONLY", "").strip().lower() in ("1", "true", "yes", "on")


def sqlite_is_read_only(path: Path) -> bool:
    """An existing database file this process cannot write (its mode, an immutable or
    read-only file system -- which stops root too -- or a directory it cannot create the
    WAL files in)."""
    if not path.is_file():
        return False
    return not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK | os.X_OK)


def _sqlite_readonly_url(path: Path) -> str:
    """`mode=ro`; `immutable=1` when the directory is not writable either (SQLite cannot
    create the WAL index beside the file, and nobody can be writing the database)."""
    resolved = path.resolve()
    quoted = quote(str(resolved))
    dir_writable = os.access(resolved.parent, os.W_OK | os.X_OK)
    option = "mode=ro" if dir_writable or Path(f"{resolved}-shm").exists() else "immutable=1"
    return f"sqlite:///file:{quoted}?{option}&uri=true"


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine with the per-connection settings the store relies on; `readonly` opens a
    SQLite file with `mode=ro` (PostgreSQL: read-only transactions)."""
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:")
        path = sqlite_file(url)
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
        if readonly and path is not None:
            engine = create_engine(_sqlite_readonly_url(path), **kwargs)
            event.listen(engine, "connect", _sqlite_connect_readonly)
            event.listen(engine, "begin", _sqlite_begin_deferred)
            return engine
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        if in_memory:
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if readonly:
        return create_engine(
            url,
            pool_pre_ping=True,
            connect_args={"options": "-c default_transaction_read_only=on"},
        )
    return create_engine(url, pool_pre_ping=True)
