"""Failure families: stack/exchange signatures, similar past incidents, family links.

A signature is what "have we seen this before?" compares:

    finding kinds     the failed checks of an exchange / an incident's symptom kinds
    confirmed causes  catalogue ids of causes with status `confirmed`
    fingerprint       model family (gemma, qwen, llama, ... from the model or weights name),
                      server build number, speculative decoding on/off, thinking default
                      on/off

Similarity is a weighted Jaccard index over the signature's elements (each kind, each
confirmed cause, and one element per known fingerprint field such as `family=qwen`):

    similarity(Q, P) = sum of weights of elements in both / sum of weights in either

with the weights in WEIGHTS (a confirmed cause counts double a finding kind, a shared
thinking default as much as a kind, model family, speculative decoding and build less).
A dimension the query does not know (no findings, no causes, unknown fingerprint field)
is left out of the comparison on both sides. Unknowns on the past incident's side still
count in the union: it explains less of what we know now. A fresh capture has no
confirmed causes yet; until it has, the causes its findings name directly stand in for
them (IMPLIED_CAUSES: a `reasoning-exhausted-budget` finding *is* the observation of the
`reasoning-exhausts-budget` mechanism), so a capture matches past incidents by mechanism
even when their recorded symptoms use other words.

Every incident has one compact row in `incidentsignature` (created by migration
0002_search): bit masks of the known kinds and causes, the texts of all of them, counts
and the fingerprint fields. Triggers mark the row stale whenever the incident's stack,
symptoms or causes change; `refresh_signatures` recomputes stale rows (the write paths of
this module and the `triage family` command call it). `similar_incidents` scores fresh
rows in one SQL statement (a scan of 100k narrow rows with bit tests) and stale rows in
Python with the same formula, so results never depend on whether a refresh has run.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    cast,
    literal,
    literal_column,
    or_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Field, Session, SQLModel, col, select

from kb import vocab
from kb.domain import flags
from kb.models import Cause, FamilyLink, Incident, Symptom
from kb.repo.store import StoreError, require_incident

__all__ = [
    "IMPLIED_CAUSES",
    "MODEL_FAMILIES",
    "WEIGHTS",
    "FamilyMatch",
    "IncidentSignature",
    "Signature",
    "incident_signature",
    "incident_stack",
    "link_family",
    "refresh_signatures",
    "signature",
    "similar_incidents",
    "similarity",
    "stack_fingerprint",
]

# Bits of `kinds_mask` / `causes_mask`: bit = the id's stable number as recorded in the
# store (kb/vocab.py `family_bits`), never a tuple position, so stored masks mean the same
# thing after an id is added anywhere. An id without a recorded number is matched by its
# text in `kinds` / `causes`.

# Finding kinds that are direct observations of one catalogue cause (see module docstring).
IMPLIED_CAUSES = {
    "reasoning-exhausted-budget": "reasoning-exhausts-budget",
    "parse-failure": "output-parsing",
    "tool-markup-leaked": "output-parsing",
    # Issue 13: findings that name their mechanism (markup of the thought in content is the
    # leak; a client view that lost what the wire carried is the client's handling).
    "reasoning-markup-in-content": "reasoning-leak",
    "client-lost-reply": "client-handling",
}

# Relative weights, integers so that SQL sums them exactly and cheaply (only the final
# division is in floating point): a finding kind 4, a confirmed cause 8, a shared thinking
# default 4, model family 2, speculative decoding 2, server build 1.
WEIGHTS = {
    "kind": 4,
    "cause": 8,
    "model_family": 2,
    "server_build": 1,
    "spec": 2,
    "thinking": 4,
}
FINGERPRINT_FIELDS = ("model_family", "server_build", "spec", "thinking")

# Looked for in the file name of the model/weights, at a word start; "llama" only when no
# other family is named (it matches inside words: codellama, tinyllama).
MODEL_FAMILIES = (
    "gemma",
    "qwen",
    "mixtral",
    "mistral",
    "ministral",
    "deepseek",
    "phi",
    "gpt-oss",
    "glm",
    "granite",
    "command-r",
    "falcon",
    "olmo",
    "smollm",
    "internlm",
    "minicpm",
    "exaone",
    "hunyuan",
    "kimi",
    "yi",
    "llama",
)
_FAMILY_PATTERNS = [
    (name, re.compile(("" if name == "llama" else r"(?<![a-z])") + re.escape(name)))
    for name in MODEL_FAMILIES
]
# Stack keys read for each fingerprint field, in order of preference.
_MODEL_KEYS = ("model", "weights", "model_path", "model_name")
_BUILD_KEYS = vocab.BUILD_KEYS
_SPEC_KEYS = ("speculative", "spec", "speculative_decoding")
_THINKING_KEYS = ("thinking_default", "thinking", "enable_thinking")
_ON = {"on", "true", "yes", "1", "enabled", "enable"}
_OFF = {"off", "false", "no", "0", "none", "disabled", "disable"}
_UNKNOWN = {"", "not", "unknown", "n", "na", "unrecorded", "null"}


class IncidentSignature(SQLModel, table=True):
    """The stored signature of one incident (see the module docstring)."""

    incident_id: int = Field(
        sa_column=Column(Integer, ForeignKey("incident.id", ondelete="CASCADE"), primary_key=True)
    )
    stale: bool = Field(default=True, sa_column=Column(Boolean, nullable=False))
    kinds_mask: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    causes_mask: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    kinds: str = Field(default="", sa_column=Column(Text, nullable=False))
    causes: str = Field(default="", sa_column=Column(Text, nullable=False))
    model_family: str = Field(default="", sa_column=Column(String(50), nullable=False))
    server_build: str = Field(default="", sa_column=Column(String(50), nullable=False))
    spec: str = Field(default="", sa_column=Column(String(8), nullable=False))
    thinking: str = Field(default="", sa_column=Column(String(8), nullable=False))
    kinds_count: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    causes_count: int = Field(default=0, sa_column=Column(Integer, nullable=False))


_SIGNATURES = IncidentSignature.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Signature:
    """Finding kinds, confirmed causes and the stack fingerprint of an exchange or incident."""

    kinds: frozenset[str] = frozenset()
    causes: frozenset[str] = frozenset()
    model_family: str = ""
    server_build: str = ""
    spec: str = ""  # "on" | "off" | "" (unknown)
    thinking: str = ""  # "on" | "off" | "" (unknown)

    def fingerprint(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in FINGERPRINT_FIELDS}

    def compared_causes(self) -> frozenset[str]:
        """The causes compared when this is the query: confirmed, else implied by findings."""
        if self.causes:
            return self.causes
        return frozenset(IMPLIED_CAUSES[kind] for kind in self.kinds if kind in IMPLIED_CAUSES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": sorted(self.kinds),
            "causes": sorted(self.causes),
            **self.fingerprint(),
        }


@dataclass(frozen=True)
class FamilyMatch:
    """A past incident similar to the query signature, with what they share."""

    slug: str
    title: str
    status: str
    score: float
    shared_kinds: list[str] = field(default_factory=list)
    shared_causes: list[str] = field(default_factory=list)
    shared_stack: list[str] = field(default_factory=list)  # e.g. ["spec=off", "thinking=on"]
    confirmed_causes: list[str] = field(default_factory=list)
    model_family: str = ""
    linked: bool = False  # a FamilyLink already joins a cause of each incident

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ signatures (pure)


def _switch(value: Any) -> str:
    """The switch as on/off/"" (unknown) from a bool or a word; other words (a spec type) are on."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    # Free text is read by its first word: "on: the template enables thinking" is on,
    # "draft-MTP speculative decoding" is on, "not recorded" is unknown.
    first = re.match(r"\s*([a-z0-9]*)", str(value).lower())
    word = first.group(1) if first else ""
    if word in _UNKNOWN:
        return ""
    if word in _OFF:
        return "off"
    return "on"


def _args(stack: Mapping[str, Any]) -> list[str] | None:
    """Server arguments from `flags` or `args` (a list or one shell string); None if absent."""
    found: list[str] | None = None
    for key in ("flags", "args"):
        value = stack.get(key)
        if value is None:
            continue
        found = found or []
        if isinstance(value, str):
            try:
                found.extend(shlex.split(value))
            except ValueError:
                found.extend(value.split())
        else:
            found.extend(str(item) for item in value)
    return found


def _flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the last `--name VALUE` or `--name=VALUE` among `args`."""
    value: str | None = None
    for index, arg in enumerate(args):
        for name in names:
            if arg == name:
                value = args[index + 1] if index + 1 < len(args) else ""
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def model_family(*names: str) -> str:
    """The model family in the first name that has one (file names and model ids)."""
    for name in names:
        base = os.path.basename(str(name or "").rstrip("/")).lower()
        if not base:
            continue
        # The family named first wins ("deepseek-r1-distill-qwen" is deepseek).
        found = [
            (match.start(), family)
            for family, pattern in _FAMILY_PATTERNS
            if family != "llama" and (match := pattern.search(base))
        ]
        if found:
            return min(found)[1]
        if "llama" in base:
            return "llama"
    return ""


def server_build(value: Any) -> str:
    """A build number ("b9586", "9586 (abc)", "llama.cpp b11434") as digits, else the text."""
    text = str(value or "").strip().lower()
    if not text:
        return ""
    number = re.search(r"(?<![0-9a-f])b?(\d{3,})", text)
    return number.group(1) if number else text[:50]


def stack_fingerprint(stack: Mapping[str, Any]) -> dict[str, str]:
    """Model family, build, spec on/off and thinking default from a stack dict.

    Keys read: `model_family` or the file names in model/weights/model_path/model_name;
    server_build/build/build_info/system_fingerprint (or `b<digits>` in the binary path);
    speculative/spec (bool or word) else the server flags (`flags` or `args`:
    --spec-type other than none, -md, --model-draft); thinking_default/thinking/
    enable_thinking (bool or word) else the flags (--reasoning on|off, --reasoning-budget 0,
    --chat-template-kwargs with enable_thinking). Unknown fields are "".
    """
    family = str(stack.get("model_family") or "").strip().lower()
    if not family:
        family = model_family(*(str(stack.get(key) or "") for key in _MODEL_KEYS))

    build = ""
    for key in _BUILD_KEYS:
        build = server_build(stack.get(key))
        if build:
            break
    if not build and stack.get("binary"):
        match = re.search(r"(?:^|[^a-z0-9])b(\d{3,})", str(stack["binary"]).lower())
        build = match.group(1) if match else ""

    args = _args(stack)
    spec = next((_switch(stack.get(key)) for key in _SPEC_KEYS if key in stack), "")
    if not spec and args:  # no flags recorded is unknown, not "off"
        spec_type = _flag_value(args, "--spec-type")
        # A draft model turns it on; so does a --spec-type other than none.
        on = any(arg.split("=", 1)[0] in flags.DRAFT_MODEL_FLAGS for arg in args)
        if spec_type is not None and spec_type.strip().lower() not in _OFF:
            on = True
        spec = "on" if on else "off"

    thinking = next((_switch(stack.get(key)) for key in _THINKING_KEYS if key in stack), "")
    if not thinking and args:
        reasoning = _flag_value(args, "--reasoning")
        budget = _flag_value(args, "--reasoning-budget")
        kwargs = _flag_value(args, "--chat-template-kwargs") or ""
        kwargs_thinking = re.search(r'"enable_thinking"\s*:\s*(true|false)', kwargs)
        if kwargs_thinking:
            thinking = "on" if kwargs_thinking.group(1) == "true" else "off"
        elif reasoning is not None and reasoning.strip().lower() in _OFF | _ON:
            thinking = _switch(reasoning)
        elif budget is not None and budget.strip() == "0":
            thinking = "off"
    return {"model_family": family, "server_build": build, "spec": spec, "thinking": thinking}


def signature(
    finding_kinds: Iterable[str], confirmed_causes: Iterable[str], stack: Mapping[str, Any]
) -> Signature:
    """The signature of an exchange or incident (see `stack_fingerprint` for `stack`)."""
    return Signature(
        kinds=frozenset(k.strip() for k in finding_kinds if k and k.strip()),
        causes=frozenset(c.strip() for c in confirmed_causes if c and c.strip()),
        **stack_fingerprint(stack),
    )


def incident_stack(incident: Incident) -> dict[str, Any]:
    """The stack dict of a stored incident: its stack columns plus its free-form extras."""
    return {
        "model": incident.model,
        "weights": incident.weights,
        "server_build": incident.server_build,
        "flags": list(incident.flags or []),
        **(incident.stack or {}),
    }


def _elements(sig: Signature, *, as_query: bool = False) -> dict[str, int]:
    causes = sig.compared_causes() if as_query else sig.causes
    elements = {f"kind:{kind}": WEIGHTS["kind"] for kind in sig.kinds}
    elements.update({f"cause:{cause}": WEIGHTS["cause"] for cause in causes})
    for name, value in sig.fingerprint().items():
        if value:
            elements[f"{name}={value}"] = WEIGHTS[name]
    return elements


def _compared(query: Signature) -> set[str]:
    dims = {name for name, value in query.fingerprint().items() if value}
    if query.kinds:
        dims.add("kinds")
    if query.compared_causes():
        dims.add("causes")
    return dims


def _dimension(element: str) -> str:
    if element.startswith("kind:"):
        return "kinds"
    if element.startswith("cause:"):
        return "causes"
    return element.split("=", 1)[0]


def similarity(query: Signature, past: Signature) -> float:
    """Weighted Jaccard of two signatures over the dimensions the query knows (see module)."""
    dims = _compared(query)
    mine = _elements(query, as_query=True)
    theirs = {e: w for e, w in _elements(past).items() if _dimension(e) in dims}
    shared = sum(weight for element, weight in mine.items() if element in theirs)
    union = sum(mine.values()) + sum(theirs.values()) - shared
    return shared / union if union > 0 else 0.0


# ------------------------------------------------------------------ stored signatures


def _split(text: str) -> frozenset[str]:
    return frozenset(part for part in (text or "").split(",") if part)


def _from_row(row: Any) -> Signature:
    return Signature(
        kinds=_split(row.kinds),
        causes=_split(row.causes),
        model_family=row.model_family,
        server_build=row.server_build,
        spec=row.spec,
        thinking=row.thinking,
    )


def _computed(session: Session, incident_ids: Sequence[int]) -> dict[int, Signature]:
    """Signatures of stored incidents computed from their rows (three queries)."""
    if not incident_ids:
        return {}
    ids = list(incident_ids)
    kinds: dict[int, set[str]] = {i: set() for i in ids}
    causes: dict[int, set[str]] = {i: set() for i in ids}
    for incident_id, kind in session.exec(
        select(Symptom.incident_id, Symptom.kind).where(Symptom.incident_id.in_(ids))  # type: ignore[attr-defined]
    ).all():
        if kind:
            kinds[incident_id].add(kind)
    for incident_id, catalogue_id in session.exec(
        select(Cause.incident_id, Cause.catalogue_id).where(
            Cause.incident_id.in_(ids),  # type: ignore[attr-defined]
            Cause.status == "confirmed",
        )
    ).all():
        causes[incident_id].add(catalogue_id)
    incidents = session.exec(select(Incident).where(Incident.id.in_(ids))).all()  # type: ignore[union-attr]
    return {
        incident.id: signature(kinds[incident.id], causes[incident.id], incident_stack(incident))
        for incident in incidents
        if incident.id is not None
    }


def incident_signature(session: Session, slug: str) -> Signature:
    """The signature of a stored incident, from its current rows."""
    incident = require_incident(session, slug)
    assert incident.id is not None
    return _computed(session, [incident.id])[incident.id]


def _row_values(sig: Signature, bits: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    return {
        "stale": False,
        "kinds_mask": sum(bits["check"].get(kind, 0) for kind in sig.kinds),
        "causes_mask": sum(bits["cause"].get(cause, 0) for cause in sig.causes),
        # Kinds and causes are ids without commas (schema: [A-Za-z0-9._-]); drop any that
        # are not, rather than corrupt the list.
        "kinds": ",".join(sorted(k for k in sig.kinds if "," not in k)),
        "causes": ",".join(sorted(c for c in sig.causes if "," not in c)),
        "model_family": sig.model_family[:50],
        "server_build": sig.server_build[:50],
        "spec": sig.spec[:8],
        "thinking": sig.thinking[:8],
        "kinds_count": len(sig.kinds),
        "causes_count": len(sig.causes),
    }


def _pending(session: Session, incident_ids: Iterable[int] | None) -> list[int]:
    if incident_ids is not None:
        return sorted(set(incident_ids))
    return list(
        session.exec(
            select(IncidentSignature.incident_id)
            .where(IncidentSignature.stale == True)  # noqa: E712 (SQL expression)
            .order_by(_SIGNATURES.c.incident_id)
        ).all()
    )


def refresh_signatures(
    session: Session,
    incident_ids: Iterable[int] | None = None,
    *,
    batch: int = 2000,
    vocabulary: vocab.Vocabulary | None = None,
) -> int:
    """Recompute stale signatures (or those of `incident_ids`); the number written.

    `vocabulary` (the catalogue's numbers, passed in by triage) is checked against the
    recorded numbers and its new ones recorded before masks are written (VocabularyError
    if a number moved); masks carry the bits of every recorded number.
    Rows are locked before the incident's rows are read (PostgreSQL), so a writer that
    changes the incident meanwhile waits and marks the row stale again afterwards.
    """
    pending = _pending(session, incident_ids)
    written = 0
    if pending and vocabulary is not None:
        recorded = vocab.record_vocabulary(session, vocabulary)
        if incident_ids is None and any(recorded.values()):  # rows newly marked stale
            pending = _pending(session, None)
    bits = vocab.family_bits(session)
    statement = (
        update(_SIGNATURES)
        .where(_SIGNATURES.c.incident_id == bindparam("b_incident_id"))
        .values({name: bindparam(name) for name in _row_values(Signature(), bits)})
    )
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        locked = list(
            session.exec(
                select(IncidentSignature.incident_id)
                .where(_SIGNATURES.c.incident_id.in_(chunk))
                .order_by(_SIGNATURES.c.incident_id)
                # A row locked by a writer is skipped: the writer marks it stale again
                # when it commits, and a refresh never waits (so it cannot deadlock).
                .with_for_update(skip_locked=True)
            ).all()
        )
        computed = _computed(session, locked)
        rows = [{"b_incident_id": i, **_row_values(sig, bits)} for i, sig in computed.items()]
        if rows:
            session.connection().execute(statement, rows)
            written += len(rows)
    return written


# ------------------------------------------------------------------ matching


def _contains(column: Any, item: str) -> ColumnElement[bool]:
    """`item` is one of the comma-separated ids in `column` (exact, no wildcards)."""
    clause: ColumnElement[bool] = (literal(",") + column + literal(",")).contains(
        f",{item},", autoescape=True
    )
    return clause


def _bit_count(column: Any, bits: Iterable[int]) -> ColumnElement[Any]:
    """How many of the given bits are set in `column` (integer arithmetic, no CASE)."""
    terms = [
        column.op(">>")(literal_column(str(bit.bit_length() - 1))).op("&")(literal_column("1"))
        for bit in bits
    ]
    total: ColumnElement[Any] = sum(terms[1:], terms[0])
    return total


def _ranked_statement(
    query: Signature, limit: int, exclude_id: int | None, family: Mapping[str, Mapping[str, int]]
) -> Any:
    """SQL for the `limit` fresh signatures most similar to `query`, as (incident_id, score).

    The same formula as `similarity`: shared / (mine + theirs - shared), where `theirs` is
    the row's weight in the dimensions the query compares (>= shared, so the divisor is at
    least `mine` > 0). The inner query computes `shared` and `theirs` once per row; its
    OFFSET 0 keeps SQLite and PostgreSQL from inlining them twice into the outer division.
    """
    t = _SIGNATURES.c
    shared: list[ColumnElement[Any]] = []
    theirs: list[ColumnElement[Any]] = []

    def weight(name: str) -> ColumnElement[Any]:
        return literal_column(str(int(WEIGHTS[name])))

    for dimension, column, mask, bits, texts in (
        ("kind", t.kinds_count, t.kinds_mask, family["check"], query.kinds),
        ("cause", t.causes_count, t.causes_mask, family["cause"], query.compared_causes()),
    ):
        if not texts:
            continue
        known = [bits[item] for item in sorted(texts) if item in bits]
        count: list[ColumnElement[Any]] = [_bit_count(mask, known)] if known else []
        text_column = t.kinds if dimension == "kind" else t.causes
        count += [
            cast(_contains(text_column, item), Integer)
            for item in sorted(texts)
            if item not in bits
        ]
        shared.append(sum(count[1:], count[0]) * weight(dimension))
        theirs.append(column * weight(dimension))
    for name, value in query.fingerprint().items():
        if value:
            shared.append(cast(t[name] == value, Integer) * weight(name))
            theirs.append(cast(t[name] != "", Integer) * weight(name))
    inner = select(
        t.incident_id.label("incident_id"),
        sum(shared[1:], shared[0]).label("shared"),
        sum(theirs[1:], theirs[0]).label("theirs"),
    ).where(t.stale == False)  # noqa: E712 (SQL expression)
    if exclude_id is not None:
        inner = inner.where(t.incident_id != exclude_id)
    rows = inner.offset(0).subquery("candidate")
    mine: ColumnElement[Any] = literal_column(
        str(int(sum(_elements(query, as_query=True).values())))
    )
    score = (cast(rows.c.shared, Float) / cast(mine + rows.c.theirs - rows.c.shared, Float)).label(
        "score"
    )
    return (
        select(rows.c.incident_id, score)
        .order_by(score.desc(), rows.c.incident_id.desc())
        .limit(limit)
    )


def _linked_incidents(session: Session, incident_id: int, others: Sequence[int]) -> set[int]:
    """Which of `others` share a FamilyLink (either direction) with `incident_id`."""
    if not others:
        return set()
    from_cause = Cause.__table__.alias("from_cause")  # type: ignore[attr-defined]
    to_cause = Cause.__table__.alias("to_cause")  # type: ignore[attr-defined]
    links = FamilyLink.__table__  # type: ignore[attr-defined]
    statement = (
        select(from_cause.c.incident_id, to_cause.c.incident_id)
        .select_from(links)
        .join(from_cause, from_cause.c.id == links.c.from_cause_id)
        .join(to_cause, to_cause.c.id == links.c.to_cause_id)
        .where(
            or_(
                and_(
                    from_cause.c.incident_id == incident_id,
                    to_cause.c.incident_id.in_(list(others)),
                ),
                and_(
                    to_cause.c.incident_id == incident_id,
                    from_cause.c.incident_id.in_(list(others)),
                ),
            )
        )
    )
    linked: set[int] = set()
    for a, b in session.connection().execute(statement):
        linked.add(b if a == incident_id else a)
    return linked


def similar_incidents(
    session: Session,
    query: Signature,
    limit: int = 10,
    *,
    exclude_slug: Optional[str] = None,
    min_score: float = 0.1,
) -> list[FamilyMatch]:
    """Past incidents most similar to `query`, best first (score >= `min_score`).

    `exclude_slug` leaves out the incident the query came from and reports which matches
    are already linked to it as the same family.
    """
    limit = max(1, int(limit))
    if not _elements(query, as_query=True):
        return []
    exclude_id: int | None = None
    if exclude_slug is not None:
        exclude_id = require_incident(session, exclude_slug).id
    scored: dict[int, tuple[float, Signature | None]] = {
        int(row.incident_id): (float(row.score), None)
        for row in session.connection().execute(
            _ranked_statement(query, limit, exclude_id, vocab.family_bits(session))
        )
    }

    # Stale rows: scored from the incident's rows, with the Python formula.
    stale_ids = [
        i
        for i in session.exec(
            select(IncidentSignature.incident_id).where(
                IncidentSignature.stale == True  # noqa: E712 (SQL expression)
            )
        ).all()
        if i != exclude_id
    ]
    for incident_id, sig in _computed(session, stale_ids).items():
        scored[incident_id] = (similarity(query, sig), sig)

    ranked = sorted(scored.items(), key=lambda item: (-item[1][0], -item[0]))
    ranked = [item for item in ranked if item[1][0] >= min_score][:limit]
    if not ranked:
        return []
    ids = [incident_id for incident_id, _ in ranked]
    fresh = [incident_id for incident_id, (_score, sig) in ranked if sig is None]
    if fresh:
        rows = session.exec(
            select(IncidentSignature).where(IncidentSignature.incident_id.in_(fresh))  # type: ignore[attr-defined]
        ).all()
        loaded = {row.incident_id: _from_row(row) for row in rows}
        ranked = [
            (i, (score, sig or loaded[i])) for i, (score, sig) in ranked if sig or i in loaded
        ]
    incidents = {
        row[0]: row
        for row in session.exec(
            select(Incident.id, Incident.slug, Incident.title, Incident.status).where(
                Incident.id.in_(ids)  # type: ignore[union-attr]
            )
        ).all()
    }
    linked = _linked_incidents(session, exclude_id, ids) if exclude_id is not None else set()
    return [
        _match(query, score, sig, incidents[incident_id], incident_id in linked)
        for incident_id, (score, sig) in ranked
        if incident_id in incidents and sig is not None
    ]


def _match(query: Signature, score: float, sig: Signature, row: Any, linked: bool) -> FamilyMatch:
    """One past incident's match with what it shares with the query."""
    _id, slug, title, status = row
    query_stack = query.fingerprint()
    return FamilyMatch(
        slug=slug,
        title=title,
        status=status,
        score=round(score, 4),
        shared_kinds=sorted(query.kinds & sig.kinds),
        shared_causes=sorted(query.compared_causes() & sig.causes),
        shared_stack=[
            f"{name}={value}"
            for name, value in sig.fingerprint().items()
            if value and query_stack[name] == value
        ],
        confirmed_causes=sorted(sig.causes),
        model_family=sig.model_family,
        linked=linked,
    )


# ------------------------------------------------------------------ family links


def _cause(session: Session, incident: Incident, cause: str) -> Cause:
    """A cause of `incident` by key, else by catalogue id if exactly one cause has it."""
    rows = session.exec(
        select(Cause).where(
            Cause.incident_id == incident.id,
            or_(Cause.key == cause, Cause.catalogue_id == cause),  # type: ignore[arg-type]
        )
    ).all()
    by_key = [row for row in rows if row.key == cause]
    if by_key:
        return by_key[0]
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise StoreError(f"incident {incident.slug!r} has no cause {cause!r}")
    keys = sorted(row.key for row in rows)
    raise StoreError(f"incident {incident.slug!r}: {cause!r} is ambiguous (causes {keys})")


def link_family(
    session: Session,
    from_slug: str,
    from_cause: str,
    to_slug: str,
    to_cause: str,
    note: str = "",
) -> FamilyLink:
    """Record that a cause of one incident is the same failure family as a cause of another.

    Causes are named by key or catalogue id. Links are undirected: if the pair is already
    linked either way, that link is returned (its note replaced when `note` is given).
    """
    source = require_incident(session, from_slug)
    target = require_incident(session, to_slug)
    if source.id == target.id:
        raise StoreError("a family link joins causes of two different incidents")
    a = _cause(session, source, from_cause)
    b = _cause(session, target, to_cause)
    assert a.id is not None and b.id is not None
    existing = session.exec(
        select(FamilyLink).where(
            or_(
                and_(col(FamilyLink.from_cause_id) == a.id, col(FamilyLink.to_cause_id) == b.id),
                and_(col(FamilyLink.from_cause_id) == b.id, col(FamilyLink.to_cause_id) == a.id),
            )
        )
    ).first()
    if existing is not None:
        if note and existing.note != note:
            existing.note = note
            session.add(existing)
            session.flush()
        return existing
    link = FamilyLink(from_cause_id=a.id, to_cause_id=b.id, note=note)
    session.add(link)
    session.flush()
    return link
