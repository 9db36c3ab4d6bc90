"""Typed records the knowledge-base service takes and returns (no ORM rows leave kb)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

from kb.domain.triggers import Trigger

# The live records are kb.repo.live's and kb.repo.liveincidents' own, returned as they are.
from kb.repo.live import CellCount as CellCount
from kb.repo.live import SeriesPoint as SeriesPoint
from kb.repo.live import Upstream as Upstream
from kb.repo.liveincidents import LiveIncident as LiveIncident
from kb.repo.runlog import RunInfo


@dataclass(frozen=True)
class IncidentFilters:
    """What the incident list filters on; every field maps to a SQL condition."""

    query: str = ""
    statuses: tuple[str, ...] = ()
    cause: str = ""
    cause_status: str = ""
    decision: str = ""  # latest decision kind, or "none"
    family: str = ""  # a family key from `families()`


@dataclass
class IncidentRow:
    """One line of the incident list."""

    slug: str
    title: str
    status: str
    opened: date
    findings: list[str] = field(default_factory=list)
    confirmed_causes: list[str] = field(default_factory=list)
    decision: str = ""
    decision_at: datetime | None = None
    revisit_on: date | None = None
    match: str = ""  # where a search matched, with a snippet


@dataclass
class IncidentPage:
    """One page of the incident list and where it sits in the whole."""

    rows: list[IncidentRow]
    total: int
    page: int
    pages: int
    searched: bool = False


@dataclass(frozen=True)
class IncidentTitle:
    """An incident's slug and title (the incident picker)."""

    slug: str
    title: str


@dataclass
class Family:
    """Incidents linked by same-family causes, keyed by the first slug."""

    key: str
    label: str
    incident_ids: set[int]


@dataclass(frozen=True)
class DecisionRow:
    """One recorded decision with its incident's slug, title and current status."""

    slug: str
    title: str
    incident_status: str
    kind: str
    at: datetime
    by: str
    rationale: str
    tradeoff: str
    fix: str
    verified: bool
    revisit_on: date | None
    # Stored trigger documents (kb.triggers' normalised form, as in an incident file).
    triggers: tuple[Trigger, ...] = ()


@dataclass(frozen=True)
class DecisionRequest:
    """A decision to record: PARKED / FIXED / REOPENED and what it rests on (the same
    rules as `triage decide`; kb.repo.decisions checks them)."""

    kind: str
    by: str = ""
    rationale: str = ""
    tradeoff: str = ""
    fix: str = ""
    revisit_on: date | None = None
    # Triggers in the CLI's syntax (kb.repo.decisions.TRIGGER_SYNTAX), one per entry.
    triggers: tuple[str, ...] = ()
    evidence_keys: tuple[str, ...] = ()
    # Record a FIXED decision even when the evidence does not verify it (labelled unverified).
    force: bool = False
    at: datetime | None = None  # when it was decided (default: now)


@dataclass(frozen=True)
class RecordedDecision:
    """A decision as stored (FIXED: its rationale says whether the evidence verified it)
    and the incident status it left."""

    slug: str
    kind: str
    at: datetime
    by: str
    rationale: str
    tradeoff: str
    fix: str
    verified: bool
    revisit_on: date | None
    # Stored trigger documents (kb.triggers' normalised form, as in an incident file).
    triggers: tuple[Trigger, ...]
    evidence_keys: tuple[str, ...]
    incident_status: str


@dataclass(frozen=True)
class StatusChange:
    """A cause's status change as recorded in its history."""

    slug: str
    cause: str
    from_status: str | None
    to_status: str
    actor: str
    rationale: str
    evidence_keys: tuple[str, ...]


@dataclass(frozen=True)
class IncidentRuns:
    """The engine runs of one incident (newest first) and which run recorded each evidence."""

    runs: list[RunInfo] = field(default_factory=list)
    evidence_run: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveOverview:
    """What the proxy recorded in a window: the upstream, the rate series, the cells and
    the incidents it opened (kb.repo.live's shapes)."""

    upstream: Upstream | None
    points: list[SeriesPoint]
    cells: list[CellCount]
    opened: list[LiveIncident]
