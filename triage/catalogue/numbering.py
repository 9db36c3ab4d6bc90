"""Refuse a catalogue whose stored numbering would change.

Cause ids and finding kinds (check ids) are packed into bit masks in the database by their
stable numbers (kb/vocab.py). The store records id -> number the first time a number is
used (`kb.vocab.record_numbers`); `check_store_numbering` compares the catalogue with that
record and with kb's own vocabulary before anything reads or writes stored rows. kb never
imports triage, so the check lives here: one function, called where the CLI opens the
store (triage/commands/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kb import vocab
from kb.repo.store import Store
from triage.catalogue.registry import Catalogue, CatalogueError, Section

__all__ = ["check_numbering", "check_store_numbering", "check_vocab"]


def _sections(catalogue: Catalogue) -> dict[str, tuple[Section[Any], Mapping[str, int]]]:
    """Stored section name -> (catalogue section, kb's built-in numbers for it)."""
    return {
        "cause": (catalogue.causes, vocab.CAUSE_NUMBERS),
        "check": (catalogue.checks, vocab.KIND_NUMBERS),
    }


def check_vocab(catalogue: Catalogue) -> None:
    """Built-in ids keep kb.vocab's numbers; other ids number from vocab.PLUGIN_FIRST."""
    for section, builtin in _sections(catalogue).values():
        for entry_id, number in section.numbers().items():
            expected = builtin.get(entry_id)
            if expected is not None and number != expected:
                raise CatalogueError(
                    f"{section.name} {entry_id!r} ({section.origin(entry_id)}) is registered "
                    f"as number {number}, but kb.vocab numbers it {expected}"
                )
            if expected is None and number < vocab.PLUGIN_FIRST:
                raise CatalogueError(
                    f"{section.name} {entry_id!r} ({section.origin(entry_id)}) uses number "
                    f"{number}: numbers below {vocab.PLUGIN_FIRST} belong to kb.vocab's "
                    "built-in vocabulary; a plugin numbers from "
                    f"{vocab.PLUGIN_FIRST}"
                )


def check_numbering(catalogue: Catalogue, stored: Mapping[str, Mapping[str, int]]) -> None:
    """Raise CatalogueError if the catalogue disagrees with kb.vocab or the stored record."""
    check_vocab(catalogue)
    for name, (section, builtin) in _sections(catalogue).items():
        # kb.vocab against the record, also for ids no plugin registers (reserved causes).
        held = {number: term_id for term_id, number in stored.get(name, {}).items()}
        for term_id, number in builtin.items():
            was, holder = stored.get(name, {}).get(term_id), held.get(number)
            problems = []
            if was is not None and was != number:
                problems.append(f"this knowledge base stored {term_id!r} as {was}")
            if holder is not None and holder != term_id:
                problems.append(f"it stored number {number} for {holder!r}")
            if problems:
                raise CatalogueError(
                    f"kb.vocab numbers {section.name} {term_id!r} as {number}, but "
                    f"{' and '.join(problems)}: stored rows would be mis-read"
                )
    # kb.vocab's own terms count as stored: a plugin may not take a reserved id's number
    # even before that id has been used.
    for name, (section, builtin) in _sections(catalogue).items():
        section.check_numbering({**builtin, **stored.get(name, {})})


def check_store_numbering(
    store: Store, catalogue: Catalogue | None = None, *, record: bool = False
) -> None:
    """Check the catalogue against the store's recorded numbers (a read-only transaction).

    With `record`, also record the catalogue's ids the store has not seen yet (one write
    transaction, re-checked inside it): call it from a path that writes anyway, so that a
    command that fails changes nothing.
    """
    if catalogue is None:
        from triage.catalogue import catalogue as process_catalogue

        catalogue = process_catalogue()
    with store.session(readonly=True) as session:
        stored = vocab.stored_numbers(session)
    check_numbering(catalogue, stored)
    sections = _sections(catalogue)
    missing = any(
        set(section.numbers()) - set(stored.get(name, {}))
        for name, (section, _) in sections.items()
    )
    if not record or not missing:
        return
    with store.session() as session:
        stored = vocab.stored_numbers(session)
        check_numbering(catalogue, stored)
        for name, (section, _) in sections.items():
            vocab.record_numbers(session, name, section.numbers())
