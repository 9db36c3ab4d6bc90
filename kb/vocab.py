"""The stored vocabulary: (section, id, number), and the family bit of a recorded number.

kb does not know what the ids mean. The catalogue (triage) declares each cause's and each
check's number in the entry's own file (triage/plugin_api.py) and passes them in as a
`Vocabulary`; kb keeps the record and the bits:

- `record_vocabulary` records the numbers not stored yet (table `vocabnumber`) in the
  transaction that uses them (`kb.repo.family.refresh_signatures(..., vocabulary=...)`), after
  refusing a vocabulary whose numbers moved against the record (`check_numbers`). Rows of
  `incidentsignature` that hold a newly numbered id as text are marked stale, so a new id
  needs no migration.
- `family_bits` gives every recorded number below `BIT_LIMIT` its bit (stored masks are
  signed 64-bit integers): built-in and plugin ids alike. An id without a recorded number
  (or a larger one) is matched by its text in family search.
- A number, once recorded, belongs to its id for ever: a catalogue that moved one would
  mis-read the stored masks, and is refused (`VocabularyError`, naming the id and both
  numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Integer,
    String,
    Text,
    UniqueConstraint,
    literal,
    or_,
    table,
    update,
)
from sqlalchemy import column as sql_column
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

from kb.domain.errors import StoreError
from kb.models import utcnow

__all__ = [
    "BIT_LIMIT",
    "BUILD_KEYS",
    "SECTIONS",
    "VocabNumber",
    "Vocabulary",
    "VocabularyError",
    "WEIGHTS_KEYS",
    "check_numbers",
    "family_bits",
    "record_numbers",
    "record_vocabulary",
    "stored_numbers",
]

# Stored sections: a catalogue's numbered sections (causes, checks = finding kinds).
SECTIONS = ("cause", "check")
# Numbers 0..BIT_LIMIT-1 have a bit in the family masks (signed 64-bit integers).
BIT_LIMIT = 63

# Keys of a stack dict or an evidence payload that carry a llama-server build ("b11434-abc",
# 11434) or a weights-file hash, in order of preference (kb.repo.family reads the first present;
# kb.triggers searches payloads for all). `sha256` alone is not one: captures use it for
# the hash of the raw capture.
BUILD_KEYS = ("server_build", "build", "build_info", "build_number", "system_fingerprint")
WEIGHTS_KEYS = ("weights_sha256", "weights_hash", "model_sha256", "model_hash")


class VocabularyError(StoreError):
    """A vocabulary whose numbers disagree with the ones this knowledge base recorded."""


@dataclass(frozen=True)
class Vocabulary:
    """What a catalogue numbers, by stored section: cause id -> number, finding kind ->
    number. Passed in by the caller; kb does not know what the ids mean."""

    causes: Mapping[str, int] = field(default_factory=dict)
    checks: Mapping[str, int] = field(default_factory=dict)

    def sections(self) -> dict[str, Mapping[str, int]]:
        return {"cause": self.causes, "check": self.checks}


class VocabNumber(SQLModel, table=True):
    """id -> number of a numbered catalogue section, recorded the first time it is used."""

    __table_args__ = (UniqueConstraint("section", "number"),)
    section: str = Field(sa_column=Column(String(20), primary_key=True))
    term_id: str = Field(sa_column=Column(String(100), primary_key=True))
    number: int = Field(sa_column=Column(Integer, nullable=False))
    recorded_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


_TABLE = VocabNumber.__table__  # type: ignore[attr-defined]
# The columns of kb.repo.family's signature table that this module marks stale (it
# imports this module, not the reverse).
_SIGNATURES = table(
    "incidentsignature",
    sql_column("stale", Boolean),
    sql_column("kinds", Text),
    sql_column("causes", Text),
)
_TEXT_COLUMN = {"check": "kinds", "cause": "causes"}


def _check_section(section: str) -> None:
    if section not in SECTIONS:
        raise ValueError(f"unknown vocabulary section {section!r} (expected one of {SECTIONS})")


def stored_numbers(session: Session) -> dict[str, dict[str, int]]:
    """section -> {id: number} as recorded in the database (every section present)."""
    result: dict[str, dict[str, int]] = {section: {} for section in SECTIONS}
    rows = session.exec(select(VocabNumber.section, VocabNumber.term_id, VocabNumber.number))
    for section, term_id, number in rows.all():
        result.setdefault(section, {})[term_id] = int(number)
    return result


def check_numbers(vocabulary: Vocabulary, stored: Mapping[str, Mapping[str, int]]) -> None:
    """Raise VocabularyError if an id of `vocabulary` was recorded with another number, or
    its number for another id (stored rows would be mis-read)."""
    for section, numbers in vocabulary.sections().items():
        record = stored.get(section, {})
        holders = {number: term_id for term_id, number in record.items()}
        for term_id, number in numbers.items():
            was, holder = record.get(term_id), holders.get(number)
            if was is not None and was != number:
                raise VocabularyError(
                    f"{section} {term_id!r} is stored as number {was} but numbered {number} "
                    "now: stored rows would be mis-read"
                )
            if holder is not None and holder != term_id:
                raise VocabularyError(
                    f"{section} number {number} is stored for {holder!r} but numbers "
                    f"{term_id!r} now: stored rows would be mis-read"
                )


def record_numbers(session: Session, section: str, numbers: Mapping[str, int]) -> list[str]:
    """Record the ids of `numbers` not stored yet; the ids written.

    Call it after checking `numbers` against `stored_numbers` (in the same transaction):
    a conflicting row raises IntegrityError from the unique constraints instead of being
    overwritten. A concurrent writer that recorded the same pair first is not an error.
    """
    _check_section(section)
    existing = stored_numbers(session)[section]
    written: list[str] = []
    for term_id, number in sorted(numbers.items(), key=lambda item: item[1]):
        if term_id in existing:
            continue
        values = {
            "section": section,
            "term_id": term_id,
            "number": int(number),
            "recorded_at": utcnow(),
        }
        try:
            with session.begin_nested():
                session.connection().execute(_TABLE.insert().values(**values))
        except IntegrityError:
            again = session.exec(
                select(VocabNumber.number).where(
                    VocabNumber.section == section, VocabNumber.term_id == term_id
                )
            ).first()
            if again != number:
                raise
            continue
        written.append(term_id)
    return written


def _mark_stale(session: Session, section: str, ids: list[str]) -> None:
    """Signatures holding one of `ids` as text were written without its bit: recompute them."""
    if not ids:
        return
    text = _SIGNATURES.c[_TEXT_COLUMN[section]]
    padded = literal(",") + text + literal(",")
    matches = [padded.contains(f",{term_id},", autoescape=True) for term_id in ids]
    for start in range(0, len(matches), 50):
        session.connection().execute(
            update(_SIGNATURES).where(or_(*matches[start : start + 50])).values(stale=True)
        )


def record_vocabulary(session: Session, vocabulary: Vocabulary) -> dict[str, list[str]]:
    """Check `vocabulary` against the record, then record its new numbers (this
    transaction); section -> the ids recorded now."""
    check_numbers(vocabulary, stored_numbers(session))
    recorded: dict[str, list[str]] = {}
    for section, numbers in vocabulary.sections().items():
        written = record_numbers(session, section, numbers)
        if written:
            _mark_stale(session, section, [i for i in written if numbers[i] < BIT_LIMIT])
        recorded[section] = written
    return recorded


def family_bits(session: Session) -> dict[str, dict[str, int]]:
    """section -> {id: bit} for every recorded number below BIT_LIMIT."""
    return {
        section: {
            term_id: 1 << number for term_id, number in numbers.items() if 0 <= number < BIT_LIMIT
        }
        for section, numbers in stored_numbers(session).items()
    }
