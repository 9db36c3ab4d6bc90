"""Command modules of the `triage` CLI; each exposes `register(group)`.

Shared here: opening the knowledge base for a command, and printing JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from kb.repo.store import Store
from kb.service import DatabaseError, KnowledgeBase, OpenError, StoreError
from triage.catalogue import CatalogueError, catalogue
from triage.catalogue.numbering import check_store_numbering

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def open_kb(ctx: click.Context) -> Iterator[KnowledgeBase]:
    """The knowledge base named by --database / TRIAGE_DATABASE_URL, its catalogue numbers
    checked; store and database errors (in the block too) become clean one-line messages."""
    url = (ctx.obj or {}).get("database")
    try:
        kb = KnowledgeBase.open(url, readonly=(ctx.obj or {}).get("read_only"))
    except OpenError as exc:
        raise click.ClickException(f"cannot open the knowledge base {exc}") from None
    except StoreError as exc:
        raise click.ClickException(f"cannot open the knowledge base: {exc}") from None
    try:
        try:
            with kb.errors():
                check_store_numbering(kb.store, catalogue())  # before any mask is read
        except CatalogueError as exc:
            raise click.ClickException(
                f"the installed catalogue cannot use this knowledge base: {exc}"
            ) from None
        except DatabaseError as exc:
            raise click.ClickException(
                f"cannot open the knowledge base {exc.url}: {exc.detail}"
            ) from None
        try:
            # One line: never the SQL statement or its parameters (they may hold captured text).
            with kb.errors():
                yield kb
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    finally:
        kb.close()


@contextmanager
def open_store(ctx: click.Context) -> Iterator[Store]:
    """The store named by --database / TRIAGE_DATABASE_URL; errors become clean messages
    (`open_kb`; for commands that still hand the store to the engine or kb's modules)."""
    with open_kb(ctx) as kb:
        yield kb.store


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
