"""The catalogue's numbers as kb stores them, and the check made where a store is opened.

Each cause and each check declares its number in its own file (triage/plugin_api.py);
kb records (section, id, number) the first time a number is used and refuses a catalogue
whose numbers moved (kb/vocab.py). This module only hands the catalogue's numbers to kb:
`vocabulary(catalogue)` for the calls that write masks or check files, and
`check_store_numbering` where the CLI and the UI open the store.
"""

from __future__ import annotations

from kb import vocab
from kb.repo.store import Store
from triage.catalogue.registry import Catalogue, CatalogueError

__all__ = ["check_store_numbering", "vocabulary"]


def vocabulary(catalogue: Catalogue) -> vocab.Vocabulary:
    """The catalogue's causes and checks with their numbers, as kb stores them."""
    return vocab.Vocabulary(causes=catalogue.causes.numbers(), checks=catalogue.checks.numbers())


def check_store_numbering(store: Store, catalogue: Catalogue, *, record: bool = False) -> None:
    """Refuse (CatalogueError) a catalogue whose numbers disagree with the store's record.

    A read-only transaction; with `record`, the catalogue's numbers not stored yet are also
    recorded (one write transaction, re-checked inside it).
    """
    numbers = vocabulary(catalogue)
    try:
        with store.session(readonly=True) as session:
            stored = vocab.stored_numbers(session)
        vocab.check_numbers(numbers, stored)
        if record:
            with store.session() as session:
                vocab.record_vocabulary(session, numbers)
    except vocab.VocabularyError as exc:
        raise CatalogueError(str(exc)) from None
