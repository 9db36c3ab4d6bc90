"""The errors of the knowledge-base service: every one a `StoreError` with one line to show.

Callers (the CLI, the UI, the proxy) catch `StoreError` only; a database driver's error never
reaches them as such (its text may hold the SQL and its parameters -- captured exchange text).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from kb.domain.errors import StoreError
from kb.repo.engine import describe_db_error, redact_url

__all__ = [
    "ConflictError",
    "DatabaseError",
    "NotFoundError",
    "OpenError",
    "StoreError",
    "database_errors",
    "db_error_line",
]


class DatabaseError(StoreError):
    """The database failed (unreachable, locked, refused a write); the message is one line
    with the driver's own text, never the SQL statement or its parameters. `url` is the
    knowledge base's URL without its password, `detail` the driver's line."""

    def __init__(self, message: str, *, url: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.detail = detail or message


class OpenError(DatabaseError):
    """The knowledge base could not be opened; the message names its (redacted) URL."""


class ConflictError(DatabaseError):
    """A concurrent writer stored the same row first (a unique key); retrying finds it."""


class NotFoundError(StoreError):
    """No such incident, cause or evidence; the message names what was asked for."""


def db_error_line(url: str, readonly: bool, exc: BaseException) -> str:
    """One line for a database error; a write refused by a read-only knowledge base says so."""
    detail = describe_db_error(exc)
    if readonly and any(
        marker in detail.lower() for marker in ("readonly", "read-only", "query_only")
    ):
        return (
            f"the knowledge base {redact_url(url)} is open read-only; this command "
            f"writes ({detail})"
        )
    return f"database error on {redact_url(url)}: {detail}"


@contextmanager
def database_errors(url: str, readonly: bool = False) -> Iterator[None]:
    """Turn a database driver's error inside the block into a `DatabaseError` (one line).

    A `StoreError` (the knowledge base refusing a write) passes through unchanged; a unique
    key a concurrent writer took first becomes `ConflictError`.
    """
    try:
        yield
    except StoreError:
        raise
    except IntegrityError as exc:
        raise _translated(ConflictError, url, readonly, exc) from exc
    except SQLAlchemyError as exc:
        raise _translated(DatabaseError, url, readonly, exc) from exc


def _translated(
    kind: type[DatabaseError], url: str, readonly: bool, exc: BaseException
) -> DatabaseError:
    return kind(
        db_error_line(url, readonly, exc), url=redact_url(url), detail=describe_db_error(exc)
    )
