"""SQLModel tables of the knowledge base.

Validation happens before rows are built (JSON Schema in kb/schemas, checks in kb/files.py
and kb/store.py): `table=True` models do not validate their fields.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any, Optional

from sqlalchemy import JSON, Column, Index, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

# Stable identifiers used in files, JSON and tests. Cause ids and finding kinds are the
# catalogue's (triage), passed in where kb needs them (kb/vocab.py).
CAUSE_STATUSES = ("confirmed", "suspected", "rejected")
CAUSE_BASES = ("measured", "inferred", "untested")
EVIDENCE_KINDS = ("measurement", "probe", "observation", "reference", "log", "exchange")
LINK_RELATIONS = ("supports", "refutes", "context")
DECISION_KINDS = ("PARKED", "FIXED", "REOPENED")
INCIDENT_STATUSES = ("open", "parked", "fixed", "reopened", "closed")


def utcnow() -> datetime:
    """Aware UTC now, to the second: every timestamp in the store is aware UTC."""
    return datetime.now(timezone.utc).replace(microsecond=0)


class Incident(SQLModel, table=True):
    id: Optional[int] = Field(default=None, primary_key=True)
    slug: str = Field(max_length=200, unique=True, index=True)
    title: str = Field(sa_column=Column(Text, nullable=False))
    opened_on: date
    closed_on: Optional[date] = None
    status: str = Field(default="open", max_length=20, index=True)
    summary: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    impact: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    # Stack summary: what ran when it failed.
    model: str = Field(default="", max_length=300)
    weights: str = Field(default="", max_length=300)
    server_build: str = Field(default="", max_length=100)
    flags: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    stack: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    timeline: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    body: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    source_file: str = Field(default="", max_length=500)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Symptom(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("incident_id", "key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    key: str = Field(max_length=100)
    kind: str = Field(default="", max_length=100)
    description: str = Field(sa_column=Column(Text, nullable=False))
    observed: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    evidence_keys: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class Cause(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("incident_id", "key"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    # `key` is unique in the incident; `catalogue_id` names the catalogue cause it refines
    # (equal to `key` for the catalogue causes themselves).
    key: str = Field(max_length=100)
    catalogue_id: str = Field(max_length=100, index=True)
    title: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(max_length=20, index=True)
    basis: str = Field(default="measured", max_length=20)
    rationale: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    deciding_probe: str = Field(default="", max_length=200)


class Evidence(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("incident_id", "key"),
        Index("ix_evidence_kind_recorded", "kind", "recorded_at"),
    )
    id: Optional[int] = Field(default=None, primary_key=True)
    # Captures may be stored before they are attached to an incident.
    incident_id: Optional[int] = Field(
        default=None, foreign_key="incident.id", index=True, ondelete="CASCADE"
    )
    key: str = Field(max_length=100)
    kind: str = Field(max_length=20)
    summary: str = Field(sa_column=Column(Text, nullable=False))
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    source: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    recorded_at: datetime = Field(default_factory=utcnow)
    run_id: Optional[int] = Field(default=None, foreign_key="triagerun.id", index=True)


class EvidenceLink(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("cause_id", "evidence_id", "relation"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    cause_id: int = Field(foreign_key="cause.id", index=True, ondelete="CASCADE")
    evidence_id: int = Field(foreign_key="evidence.id", index=True, ondelete="CASCADE")
    relation: str = Field(max_length=20)
    note: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))


class CauseStatusChange(SQLModel, table=True):
    """Append-only history: every status a cause ever had, with who, why and on what."""

    id: Optional[int] = Field(default=None, primary_key=True)
    cause_id: int = Field(foreign_key="cause.id", index=True, ondelete="CASCADE")
    from_status: Optional[str] = Field(default=None, max_length=20)
    to_status: str = Field(max_length=20)
    changed_at: datetime = Field(default_factory=utcnow)
    actor: str = Field(max_length=200)
    rationale: str = Field(sa_column=Column(Text, nullable=False))
    evidence_keys: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class Decision(SQLModel, table=True):
    id: Optional[int] = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    kind: str = Field(max_length=20, index=True)
    decided_at: datetime = Field(default_factory=utcnow)
    decided_by: str = Field(default="", max_length=200)
    rationale: str = Field(sa_column=Column(Text, nullable=False))
    tradeoff: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    fix: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    verified: bool = True
    revisit_on: Optional[date] = None
    revisit_triggers: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    evidence_keys: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class Reference(SQLModel, table=True):
    id: Optional[int] = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    url: str = Field(sa_column=Column(Text, nullable=False))
    title: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    note: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))


class FamilyLink(SQLModel, table=True):
    """A cause in one incident belongs to the same failure family as a cause in another."""

    __table_args__ = (UniqueConstraint("from_cause_id", "to_cause_id"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    from_cause_id: int = Field(foreign_key="cause.id", index=True, ondelete="CASCADE")
    to_cause_id: int = Field(foreign_key="cause.id", index=True, ondelete="CASCADE")
    note: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    created_at: datetime = Field(default_factory=utcnow)


class TriageRun(SQLModel, table=True):
    """One engine run on an incident: its plan and result, so it can be resumed and shown."""

    id: Optional[int] = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: Optional[datetime] = None
    state: str = Field(default="running", max_length=20)
    plan: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    result: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


# --------------------------------------------------------------------------- live proxy
# Written by `triage proxy` (kb/live.py): one row per recorded exchange, and one row per
# failure signature that has an incident, so that replicas sharing a database never open two.


class LiveExchange(SQLModel, table=True):
    """One exchange recorded by the live proxy (redacted; body compressed, maybe sampled out)."""

    __table_args__ = (
        Index("ix_liveexchange_cell", "model", "client", "signature", "recorded_at"),
        Index("ix_liveexchange_model_recorded", "model", "recorded_at"),
        Index("ix_liveexchange_model_shape", "model", "shape", "recorded_at"),
    )
    id: Optional[int] = Field(default=None, primary_key=True)
    # Idempotency key chosen by the proxy when the exchange happened: a spooled exchange
    # replayed twice is stored once.
    key: str = Field(max_length=64, unique=True)
    recorded_at: datetime = Field(default_factory=utcnow, index=True)
    replica: str = Field(default="", max_length=100)
    path: str = Field(default="", max_length=200)
    model: str = Field(default="", max_length=300)
    client: str = Field(default="", max_length=200)
    # "" for a working reply; else sorted failing kinds + status class, e.g. "empty-content|2xx".
    signature: str = Field(default="", max_length=300)
    failed: bool = False
    status: Optional[int] = None
    elapsed_ms: Optional[float] = None
    stream: bool = False
    upstream_build: str = Field(default="", max_length=100)
    template_sha256: str = Field(default="", max_length=64)
    findings: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # zlib-compressed JSON of the redacted exchange; None when a success was sampled out.
    body: Optional[bytes] = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    body_truncated: bool = False
    # The request's shape (triage.proxy.grouping.request_shape), e.g. "chat.stream.tools".
    shape: str = Field(default="", max_length=100)
    # Why the failure is what the client configured (its max_tokens, its stop list); "" if not.
    client_limit: str = Field(default="", max_length=200)


class LiveSignature(SQLModel, table=True):
    """A failure signature the proxy opened (or attached to) an incident for; the signatures
    of one problem (model x primary symptom x request shape) share its incident."""

    __table_args__ = (Index("ix_livesignature_problem", "model", "problem"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    key: str = Field(max_length=400, unique=True)  # model + "\x1f" + signature [+ "\x1f" shape]
    model: str = Field(default="", max_length=300)
    signature: str = Field(max_length=300)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    opened_at: datetime = Field(default_factory=utcnow)
    opened_by: str = Field(default="", max_length=100)
    first_exchange_key: str = Field(default="", max_length=64)
    latest_exchange_key: str = Field(default="", max_length=64)
    detection: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    # "primary-kind|class@shape" (triage.proxy.grouping.problem_key); "" on rows from before.
    problem: str = Field(default="", max_length=300)
