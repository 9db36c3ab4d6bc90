"""Command modules of the `triage` CLI; each exposes `register(group)`.

Shared here: opening the knowledge base for a command, and printing JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError

from kb.domain.errors import StoreError
from kb.repo.engine import database_url, describe_db_error, redact_url
from kb.repo.store import Store
from triage.catalogue import CatalogueError
from triage.catalogue.numbering import check_store_numbering

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def open_store(ctx: click.Context) -> Iterator[Store]:
    """The store named by --database / TRIAGE_DATABASE_URL; errors become clean messages."""
    url = (ctx.obj or {}).get("database")
    try:
        store = Store(url, readonly=(ctx.obj or {}).get("read_only"))
    except StoreError as exc:
        raise click.ClickException(f"cannot open the knowledge base: {exc}") from None
    except SQLAlchemyError as exc:
        raise click.ClickException(
            f"cannot open the knowledge base {redact_url(database_url(url))}: "
            f"{describe_db_error(exc)}"
        ) from None
    try:
        check_store_numbering(store)  # before any stored bit mask is read or written
    except CatalogueError as exc:
        store.close()
        raise click.ClickException(
            f"the installed catalogue cannot use this knowledge base: {exc}"
        ) from None
    except SQLAlchemyError as exc:
        store.close()
        raise click.ClickException(
            f"cannot open the knowledge base {redact_url(database_url(url))}: "
            f"{describe_db_error(exc)}"
        ) from None
    try:
        yield store
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        # One line: never the SQL statement or its parameters (they may hold captured text).
        raise click.ClickException(db_error_line(store, exc)) from None
    finally:
        store.close()


def db_error_line(store: Store, exc: SQLAlchemyError) -> str:
    """One line for a database error in a command; a write refused by a read-only
    knowledge base says so."""
    detail = describe_db_error(exc)
    if store.readonly and any(
        marker in detail.lower() for marker in ("readonly", "read-only", "query_only")
    ):
        return (
            f"the knowledge base {redact_url(store.url)} is open read-only; this command "
            f"writes ({detail})"
        )
    return f"database error on {redact_url(store.url)}: {detail}"


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def with_options(options: tuple[Callable[[F], F], ...]) -> Callable[[F], F]:
    """Apply click options kept in a tuple as if each were written above the command, in
    order (long option lists stay beside, not inside, the command function)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply
