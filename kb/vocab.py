"""The one vocabulary of the knowledge base: finding kinds and cause ids, with stable numbers.

Anything stored that depends on order uses these numbers, never a tuple position: the
family signature packs finding kinds and confirmed causes into bit masks (bit = number,
kb/family.py), so a number, once used, belongs to its id for ever.

- Built-in numbers are 0..31 (`BUILTIN_LIMIT`); a plugin's causes and checks take numbers
  from 32 up (`PLUGIN_FIRST`). kb gives bits only to the built-in vocabulary below; any
  other id (a plugin's) is matched by its text in family search, so plugins need nothing
  from kb.
- The numbers are recorded in the `vocabnumber` table the first time they are used:
  `record_builtin` runs in the transaction that writes signature masks (and refuses a kb
  whose own numbers moved); triage records its catalogue's numbers (plugins included) in
  a write of its own (`check_store_numbering(store, record=True)`). `stored_numbers` hands
  them back so that triage refuses a catalogue whose numbering moved when it opens the
  store (triage/catalogue/numbering.py). kb never imports triage: it only stores them.
- Adding an id here changes which rows carry a bit: ship it with a migration that marks
  `incidentsignature` stale (as 0003_vocab does for the reserved cause ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Column, DateTime, Integer, String, UniqueConstraint
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select

__all__ = [
    "BUILD_KEYS",
    "BUILTIN_LIMIT",
    "CATALOGUE_CAUSES",
    "CAUSE_NUMBERS",
    "CAUSES",
    "FINDING_KINDS",
    "KIND_NUMBERS",
    "PLUGIN_FIRST",
    "RESERVED_CAUSES",
    "SECTIONS",
    "Term",
    "VocabNumber",
    "WEIGHTS_KEYS",
    "builtin_numbers",
    "record_builtin",
    "record_numbers",
    "stored_numbers",
]


@dataclass(frozen=True)
class Term:
    """One vocabulary id with its stable number."""

    id: str
    number: int
    note: str = ""


# Numbers 0..31 are the built-in vocabulary's; plugins number from 32. Bits are only given
# to numbers below 63 (the masks are signed 64-bit integers), i.e. to this module's terms.
BUILTIN_LIMIT = 32
PLUGIN_FIRST = 32

FINDING_KINDS: tuple[Term, ...] = (
    Term("empty-content", 0),
    Term("length-stop", 1),
    Term("reasoning-exhausted-budget", 2),
    Term("runaway-reasoning", 3),
    Term("tool-args-invalid-json", 4),
    Term("tool-args-schema-violation", 5),
    Term("tool-markup-leaked", 6),
    Term("parse-failure", 7),
    Term("truncated-stream", 8),
    Term("http-error", 9),
    Term("timeout", 10),
    Term("server-crash", 11, "the server died serving the request (502, connection reset)"),
    Term("server-hang", 12, "the server stopped answering (504 from a proxy, a hung replay)"),
    Term(
        "repetition-to-context-end",
        13,
        "the reply repeats itself up to the context end, with no max_tokens to stop it",
    ),
    Term(
        "structured-output-failed",
        14,
        "response_format/grammar asked for, but the reply has no structured content "
        "(it landed in reasoning, or the server refused: 'does not match the expected format')",
    ),
    Term("reasoning-markup-in-content", 15, "thought markup (<think>, <|channel>) in content"),
    Term("client-lost-reply", 16, "the client's view lost tool calls or content the wire carried"),
    Term("mojibake", 17, "UTF-8 read as Latin-1/cp1252, or U+FFFD, in the visible output"),
    Term(
        "repetition-loop",
        18,
        "the answer repeats itself (word n-grams, digits as one token) up to where a limit cut it",
    ),
    Term(
        "chat-template-missing",
        19,
        "model-file lint: the GGUF has no chat template and the server is given none; "
        "llama-server falls back to ChatML",
    ),
    Term(
        "base-model-for-chat",
        20,
        "model-file lint: a base (pretrained, not instruction-tuned) model serves a chat request",
    ),
    Term(
        "end-of-turn-mismatch",
        21,
        "model-file lint: the served format closes a turn with a marker that is not one of the "
        "model's end-of-generation tokens (or not a token of its vocabulary)",
    ),
    Term(
        "gateway-error",
        22,
        "a gateway's own error page (nginx, LiteLLM, ...): 502/504, or a timeout in front of "
        "llama-server -- a gateway failure, not a server crash",
    ),
    Term(
        "server-flag-error",
        23,
        "the server refused the request for its launch flags: 'tools param requires --jinja "
        "flag', a template it cannot serve without --jinja",
    ),
    Term(
        "schema-violation",
        24,
        "the request asked for a JSON schema and the content is not JSON or violates it "
        "(HTTP 200: the grammar did not enforce it)",
    ),
    Term(
        "stream-format-violation",
        25,
        "a streamed delta breaks the OpenAI chunk format: a tool call's first delta without "
        "id/type/name, an index that jumps or changes, a resent name, arguments that do not "
        "concatenate to JSON, no finish_reason before [DONE]",
    ),
    Term(
        "unstable-prefix",
        26,
        "consecutive turns of a conversation share no (or a tiny) prompt prefix -- e.g. a "
        "timestamp first in the system prompt -- so llama-server's prompt cache reuses nothing",
    ),
    Term(
        "embedding-failed",
        27,
        "an embeddings/rerank request refused for the physical batch ('input is too large "
        "to process. increase the physical batch size'), or answered with missing, too few "
        "or NaN vectors",
    ),
    Term(
        "template-markup-in-content",
        28,
        "the chat format's turn markup (<|im_start|>, <start_of_turn>, [INST], <|eot_id|>, ...) "
        "written into the reply's content",
    ),
)

# Causes in today's catalogue (files, JSON schema enums and the engine use these).
CATALOGUE_CAUSES: tuple[Term, ...] = (
    Term("reasoning-exhausts-budget", 0),
    Term("speculative-decoding", 1),
    Term("quantized-weights", 2),
    Term("server-build", 3),
    Term("output-parsing", 4),
    Term("token-limit", 5),
)
# Reserved for the causes of ARCHITECTURE.md's real-world incidents: whoever adds one to
# the catalogue must register it with exactly this number.
RESERVED_CAUSES: tuple[Term, ...] = (
    Term("cpu-backend", 6, "CPU backend crash (AMX / repack); --no-repack removes it"),
    Term("kv-cache-quant", 7, "quantized KV cache; -ctk/-ctv f16 removes it"),
    Term("context-size", 8, "context too small / prompt truncated; a larger -c removes it"),
    Term("context-shift", 9, "context-shift runaway without max_tokens"),
    Term("structured-output", 10, "response_format/grammar together with thinking"),
    Term("reasoning-leak", 11, "thought markup left in content after a parser change"),
    Term("client-handling", 12, "client drops the thinking flag or mangles tool deltas"),
    Term("conversation-shape", 13, "multi-turn history the template mishandles"),
    Term("model-file", 14, "a broken or mismatched GGUF"),
    Term("warmup-decode", 15, "only the warm-up decode crashes; --no-warmup removes it"),
    Term("cpu-threads", 16, "a multi-threaded CPU kernel crashes; one thread removes it"),
    Term("model-loop", 17, "the model loops; anti-repetition sampling removes it"),
    Term("gateway-timeout", 18, "a gateway's deadline in front of llama-server; direct removes it"),
    Term("server-flags", 19, "a launch flag (--no-jinja, an invalid argument) breaks requests"),
    Term(
        "schema-not-enforced",
        20,
        "the JSON schema where llama-server ignores it; moved to response_format it is enforced",
    ),
    Term(
        "prompt-cache",
        21,
        "a prompt prefix that changes every turn (a timestamp first) reuses nothing of the cache",
    ),
    Term(
        "stream-format",
        22,
        "streamed deltas break the OpenAI chunk format; the same request unstreamed is well formed",
    ),
    Term(
        "embedding-batch",
        23,
        "an embeddings/rerank input longer than the physical batch (-ub); a larger one removes it",
    ),
)
CAUSES: tuple[Term, ...] = CATALOGUE_CAUSES + RESERVED_CAUSES

KIND_NUMBERS: dict[str, int] = {term.id: term.number for term in FINDING_KINDS}
CAUSE_NUMBERS: dict[str, int] = {term.id: term.number for term in CAUSES}

# Keys of a stack dict or an evidence payload that carry a llama-server build ("b11434-abc",
# 11434) or a weights-file hash, in order of preference (kb.repo.family reads the first present;
# kb.triggers searches payloads for all). `sha256` alone is not one: captures use it for
# the hash of the raw capture.
BUILD_KEYS = ("server_build", "build", "build_info", "build_number", "system_fingerprint")
WEIGHTS_KEYS = ("weights_sha256", "weights_hash", "model_sha256", "model_hash")

# Stored sections: the catalogue's numbered sections map onto these names.
SECTIONS = ("cause", "check")


def _validate(terms: tuple[Term, ...], what: str) -> None:
    # Import-time guard: a duplicate id or number here would corrupt stored masks.
    ids = [term.id for term in terms]
    numbers = [term.number for term in terms]
    if len(set(ids)) != len(ids) or len(set(numbers)) != len(numbers):
        raise RuntimeError(f"kb.vocab: duplicate {what} id or number")
    if any(not 0 <= number < BUILTIN_LIMIT for number in numbers):
        raise RuntimeError(f"kb.vocab: built-in {what} numbers must be below {BUILTIN_LIMIT}")


_validate(FINDING_KINDS, "finding kind")
_validate(CAUSES, "cause")


class VocabNumber(SQLModel, table=True):
    """id -> number of a numbered catalogue section, recorded the first time it is used."""

    __table_args__ = (UniqueConstraint("section", "number"),)
    section: str = Field(sa_column=Column(String(20), primary_key=True))
    term_id: str = Field(sa_column=Column(String(100), primary_key=True))
    number: int = Field(sa_column=Column(Integer, nullable=False))
    recorded_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


_TABLE = VocabNumber.__table__  # type: ignore[attr-defined]


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


def record_numbers(session: Session, section: str, numbers: Mapping[str, int]) -> int:
    """Record the ids of `numbers` not stored yet; the number of rows written.

    Call it after checking `numbers` against `stored_numbers` (in the same transaction):
    a conflicting row raises IntegrityError from the unique constraints instead of being
    overwritten. A concurrent writer that recorded the same pair first is not an error.
    """
    from kb.models import utcnow

    _check_section(section)
    existing = stored_numbers(session)[section]
    written = 0
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
        written += 1
    return written


def builtin_numbers() -> dict[str, dict[str, int]]:
    """kb's own vocabulary as stored sections: check -> finding kinds, cause -> cause ids."""
    return {"check": dict(KIND_NUMBERS), "cause": dict(CAUSE_NUMBERS)}


def record_builtin(session: Session) -> None:
    """Record kb's vocabulary the first time its numbers are used (a signature write), and
    refuse a kb whose numbers moved since: its bit masks would mis-read the stored ones."""
    from kb.domain.errors import StoreError

    stored = stored_numbers(session)
    for section, numbers in builtin_numbers().items():
        held = {number: term_id for term_id, number in stored[section].items()}
        for term_id, number in numbers.items():
            was = stored[section].get(term_id)
            holder = held.get(number)
            if (was is not None and was != number) or (holder is not None and holder != term_id):
                raise StoreError(
                    f"kb.vocab numbers {section} {term_id!r} as {number}, but this knowledge "
                    f"base stored {term_id!r} as {was} and number {number} for {holder!r}: "
                    "stored family signatures would be mis-read"
                )
        if set(numbers) - set(stored[section]):
            record_numbers(session, section, numbers)
