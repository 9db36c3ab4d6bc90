"""Engine runs in the knowledge base: incidents opened by a run, candidate causes, the run
row, replies and arm summaries as evidence, verdicts applied with monotone evidence, and
the queries `show` / `--resume` need. Every function is one step of one transaction (the
caller's session); the engine's recorder calls them, nothing else writes runs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TypedDict

from sqlmodel import Session, col, select

from kb.domain.diagnosis import Finding, failed_kinds
from kb.domain.errors import StoreError
from kb.domain.records import Reply
from kb.domain.slugs import unique_incident_slug
from kb.jsontypes import JsonObject
from kb.models import (
    Cause,
    Evidence,
    EvidenceLink,
    Incident,
    Symptom,
    TriageRun,
    utcnow,
)
from kb.repo.store import (
    CONTENT_HASH,
    EvidenceItem,
    add_evidence,
    add_evidence_many,
    exchange_content_hash,
    exchange_hashes,
    get_incident,
    record_status_change,
)

__all__ = [
    "CauseChange",
    "CauseSpec",
    "NewIncident",
    "RunBusy",
    "RunCandidate",
    "RunOwner",
    "VerdictRow",
    "apply_verdicts",
    "claim_run",
    "ensure_causes",
    "evidence_id",
    "finish_run",
    "heartbeat",
    "last_heartbeat",
    "latest_diagnosis",
    "latest_result",
    "mark_stale_runs",
    "new_incident",
    "owner_alive",
    "record_exchange",
    "record_replies",
    "resumable_runs",
    "run_incident_slug",
    "run_replies",
    "set_run_state",
    "start_run",
    "strength",
    "unfinished_run",
]

# A running run whose heartbeat is older than this is taken as abandoned (UI closed,
# process killed) and marked interrupted, so it can be resumed.
STALE_AFTER = timedelta(minutes=30)
HEARTBEAT = "heartbeat_at"  # key in TriageRun.plan
OWNER = "owner"  # key in TriageRun.plan: the process running it (RunOwner.to_dict)


class RunBusy(Exception):
    """The run is still running in another live process: it is not taken over."""


def _process_started(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22),
    so a pid reused by another process is not taken for the run's owner; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return int(stat.rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class RunOwner:
    """The process that runs a run: pid, host and the process's start time."""

    pid: int
    host: str
    started: int | None = None

    @classmethod
    def current(cls) -> RunOwner:
        return cls(os.getpid(), socket.gethostname(), _process_started(os.getpid()))

    def to_dict(self) -> JsonObject:
        return {"pid": self.pid, "host": self.host, "started": self.started}

    @classmethod
    def of(cls, run: TriageRun) -> RunOwner | None:
        raw = (run.plan or {}).get(OWNER)
        if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
            return None
        started = raw.get("started")
        return cls(
            int(raw["pid"]),
            str(raw.get("host") or ""),
            started if isinstance(started, int) else None,
        )

    def alive(self) -> bool | None:
        """Is the owning process still running? None when it runs on another host (only
        its heartbeat can tell)."""
        if self.host != socket.gethostname():
            return None
        if not _pid_alive(self.pid):
            return False
        return self.started is None or _process_started(self.pid) in (None, self.started)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host or 'an unknown host'}"


def strength(basis: str | None, status: str) -> int:
    """How strong the evidence behind a status is: 0 untested ("not testable in this run",
    "did not reproduce"), 1 a measured or inferred suspicion, or an inferred verdict,
    2 a measured verdict (confirmed / rejected). A run only moves a cause with evidence at
    least as strong as what set its current status."""
    if not basis or basis == "untested":
        return 0
    if basis == "measured" and status in ("confirmed", "rejected"):
        return 2
    return 1


@dataclass(frozen=True)
class CauseSpec:
    """A catalogue cause to create on an incident (id and title)."""

    id: str
    title: str


@dataclass(frozen=True)
class NewIncident:
    """What a run knows of an incident it opens."""

    model: str
    kinds: list[str]
    weights: str = ""
    flags: list[str] = field(default_factory=list)
    stack: JsonObject = field(default_factory=dict)


@dataclass
class VerdictRow:
    """One verdict to apply: status, rationale, evidence keys that support / refute."""

    cause: str
    status: str
    rationale: str
    supports: list[str]
    refutes: list[str]
    deciding_probe: str = ""
    basis: str = "measured"


def new_incident(session: Session, spec: NewIncident) -> Incident:
    """Open an incident for a failing exchange (slug from date, model and first finding)."""
    today = utcnow().date()
    first = spec.kinds[0] if spec.kinds else "failure"
    slug = unique_incident_slug(
        today, spec.model or "server", first, exists=lambda s: get_incident(session, s) is not None
    )
    incident = Incident(
        slug=slug,
        title=f"{spec.model}: {', '.join(spec.kinds) or 'failing exchange'}",
        opened_on=today,
        status="open",
        summary="Opened by `triage diagnose` from a failing exchange.",
        model=spec.model,
        weights=spec.weights,
        flags=list(spec.flags),
        stack=dict(spec.stack),
    )
    session.add(incident)
    session.flush()
    return incident


def ensure_causes(
    session: Session, incident_id: int, causes: Sequence[CauseSpec], actor: str
) -> None:
    """Create the catalogue causes the incident does not have yet (suspected, untested)."""
    existing = {c.key for c in session.exec(select(Cause).where(Cause.incident_id == incident_id))}
    for spec in causes:
        if spec.id in existing:
            continue
        cause = Cause(
            incident_id=incident_id,
            key=spec.id,
            catalogue_id=spec.id,
            title=spec.title,
            status="suspected",
            basis="untested",
            rationale="candidate from the catalogue; not yet probed",
        )
        record_status_change(
            session,
            cause,
            "suspected",
            actor=actor,
            rationale="candidate cause from the catalogue, before any probe",
        )


def record_exchange(
    session: Session, incident_id: int, exchange: JsonObject, findings: Sequence[Finding]
) -> str:
    """Store the failing exchange as evidence and its failed findings as symptoms; its key.

    An exchange whose content the incident already holds (captured before, or stored by an
    earlier diagnosis of the same incident) is not stored again: its existing key is used,
    as `triage capture` does."""
    kinds = failed_kinds(findings)
    try:
        digest = exchange_content_hash(exchange)
    except UnicodeEncodeError:
        raise StoreError(
            "the failing exchange is not valid Unicode (a lone surrogate): it cannot be stored"
        ) from None
    key = exchange_hashes(session, incident_id).get(digest)
    if key is None:
        stored = [f.to_json() for f in findings]  # as the diagnosis JSON holds them
        key = add_evidence(
            session,
            incident_id=incident_id,
            kind="exchange",
            summary="failing exchange: " + (", ".join(kinds) if kinds else "no failed finding"),
            payload={"exchange": exchange, "findings": stored, CONTENT_HASH: digest},
            source=str(exchange.get("source_file") or ""),
        ).key
    existing = {
        s.key for s in session.exec(select(Symptom).where(Symptom.incident_id == incident_id))
    }
    for finding in findings:
        if finding.passed or finding.kind in existing:
            continue
        existing.add(finding.kind)
        session.add(
            Symptom(
                incident_id=incident_id,
                key=finding.kind,
                kind=finding.kind,
                description=finding.reason,
                observed={"score": finding.score, "where": finding.where},
                evidence_keys=[key],
            )
        )
    session.flush()
    return key


def start_run(
    session: Session, incident_id: int, plan: JsonObject, owner: RunOwner | None = None
) -> int:
    """Open the run row (state running), owned by `owner` (default: this process)."""
    owner = owner or RunOwner.current()
    run = TriageRun(
        incident_id=incident_id,
        plan={**plan, HEARTBEAT: utcnow().isoformat(), OWNER: owner.to_dict()},
    )
    session.add(run)
    session.flush()
    assert run.id is not None
    return run.id


def record_replies(
    session: Session, incident_id: int, run_id: int, replies: Sequence[Reply]
) -> None:
    """Store each reply as `probe` evidence (one numbering for the whole look)."""
    items = [
        EvidenceItem("probe", r.summary(), payload=r.to_dict(), source="triage diagnose")
        for r in replies
    ]
    add_evidence_many(session, incident_id, items, run_id=run_id)
    heartbeat(session, run_id)


def run_replies(session: Session, run_id: int) -> list[Reply]:
    """The replies a run recorded (for `--resume`)."""
    rows = session.exec(
        select(Evidence).where(Evidence.run_id == run_id, Evidence.kind == "probe")
    ).all()
    return [
        Reply.from_dict(row.payload) for row in rows if (row.payload or {}).get("type") == "reply"
    ]


def evidence_id(session: Session, incident_id: int, key: str) -> int:
    row = session.exec(
        select(Evidence.id).where(Evidence.incident_id == incident_id, Evidence.key == key)
    ).one()
    assert row is not None
    return int(row)


class CauseChange(TypedDict):
    """One cause after `apply_verdicts`: status before, verdict applied or not, status now."""

    previous: str
    applied: bool
    status: str
    rationale: str


def apply_verdicts(
    session: Session, incident_id: int, run_id: int, verdicts: Sequence[VerdictRow], actor: str
) -> dict[str, CauseChange]:
    """Move each cause to its verdict, with monotone evidence: a verdict whose basis is
    weaker than what set the cause's current status (e.g. "not testable in this run" over
    a measured rejection) leaves the cause as it is. Returns, per cause, its previous
    status and whether this run moved it (`applied`)."""
    causes = {c.key: c for c in session.exec(select(Cause).where(Cause.incident_id == incident_id))}
    out: dict[str, CauseChange] = {}
    for verdict in verdicts:
        cause = causes.get(verdict.cause)
        if cause is None:
            continue
        previous = cause.status
        weaker = strength(verdict.basis, verdict.status) < strength(cause.basis, cause.status)
        out[verdict.cause] = {
            "previous": previous,
            "applied": not weaker,
            "status": cause.status if weaker else verdict.status,
            "rationale": cause.rationale if weaker else verdict.rationale,
        }
        if weaker:
            continue
        assert cause.id is not None
        for relation, keys in (("supports", verdict.supports), ("refutes", verdict.refutes)):
            for key in keys:
                ev = evidence_id(session, incident_id, key)
                exists = session.exec(
                    select(EvidenceLink).where(
                        EvidenceLink.cause_id == cause.id,
                        EvidenceLink.evidence_id == ev,
                        EvidenceLink.relation == relation,
                    )
                ).first()
                if exists is None:
                    session.add(
                        EvidenceLink(
                            cause_id=cause.id,
                            evidence_id=ev,
                            relation=relation,
                            note=f"run {run_id}",
                        )
                    )
        cause.rationale = verdict.rationale
        cause.deciding_probe = verdict.deciding_probe
        cause.basis = verdict.basis
        if cause.status != verdict.status or verdict.status != "suspected":
            record_status_change(
                session,
                cause,
                verdict.status,
                actor=actor,
                rationale=verdict.rationale,
                evidence_keys=[*verdict.supports, *verdict.refutes],
            )
        session.add(cause)
    session.flush()
    return out


def set_run_state(
    session: Session,
    run_id: int,
    state: str,
    *,
    finished: bool = False,
    result: JsonObject | None = None,
) -> None:
    run = session.get(TriageRun, run_id)
    if run is None:
        return
    run.state = state
    _beat(run)
    if finished:
        run.finished_at = utcnow()
    if result is not None:
        run.result = result
    session.add(run)


def finish_run(session: Session, run_id: int, state: str, result: JsonObject) -> None:
    set_run_state(session, run_id, state, finished=True, result=result)


def heartbeat(session: Session, run_id: int) -> None:
    run = session.get(TriageRun, run_id)
    if run is not None and run.finished_at is None:
        _beat(run)
        session.add(run)


def _beat(run: TriageRun) -> None:
    # The plan is a JSON column: reassign it (an in-place change would not be saved).
    run.plan = {**(run.plan or {}), HEARTBEAT: utcnow().isoformat()}


def last_heartbeat(run: TriageRun) -> datetime:
    """When the run last showed signs of life (its start when it never beat)."""
    beat = (run.plan or {}).get(HEARTBEAT)
    started = (
        run.started_at if run.started_at.tzinfo else run.started_at.replace(tzinfo=timezone.utc)
    )
    if not isinstance(beat, str):
        return started
    try:
        parsed = datetime.fromisoformat(beat)
    except ValueError:
        return started
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def owner_alive(
    run: TriageRun, *, now: datetime | None = None, stale_after: timedelta | None = None
) -> bool:
    """Is this run still being run by a live process? Only a `running` run can be: its
    heartbeat is recent and, when its owner runs on this host, that process (same pid, same
    start time) still exists -- a run whose process was killed is not running, whatever its
    state says."""
    if run.state != "running" or run.finished_at is not None:
        return False
    now = now or utcnow()
    if now - last_heartbeat(run) > (stale_after or STALE_AFTER):
        return False
    owner = RunOwner.of(run)
    alive = owner.alive() if owner is not None else None
    return alive is not False


def claim_run(session: Session, run_id: int, owner: RunOwner | None = None) -> None:
    """Take over an unfinished run for `owner` (default: this process), state running;
    raises RunBusy when its owner is still running it, LookupError when it is gone."""
    run = session.get(TriageRun, run_id)
    if run is None:
        raise LookupError(f"run {run_id} does not exist")
    mine = owner or RunOwner.current()
    current = RunOwner.of(run)
    if owner_alive(run) and current != mine:
        raise RunBusy(
            f"run {run_id} is still running ({current.describe() if current else 'no owner'}, "
            f"last heartbeat {last_heartbeat(run).isoformat(timespec='seconds')})"
        )
    run.state = "running"
    run.finished_at = None
    run.plan = {**(run.plan or {}), HEARTBEAT: utcnow().isoformat(), OWNER: mine.to_dict()}
    session.add(run)
    session.flush()


def mark_stale_runs(
    session: Session, *, now: datetime | None = None, stale_after: timedelta = STALE_AFTER
) -> list[int]:
    """Mark running runs that nobody runs any more (heartbeat stopped, or their process on
    this host is gone) as interrupted; returns their ids."""
    now = now or utcnow()
    stale = []
    for run in session.exec(
        select(TriageRun).where(TriageRun.state == "running", col(TriageRun.finished_at).is_(None))
    ):
        if not owner_alive(run, now=now, stale_after=stale_after):
            run.state = "interrupted"
            session.add(run)
            assert run.id is not None
            stale.append(run.id)
    return stale


def latest_result(session: Session, slug: str) -> tuple[TriageRun | None, bool]:
    """(the incident's latest run, whether the incident exists)."""
    incident = get_incident(session, slug)
    if incident is None:
        return None, False
    run = session.exec(
        select(TriageRun)
        .where(TriageRun.incident_id == incident.id)
        .order_by(col(TriageRun.id).desc())
    ).first()
    return run, True


def unfinished_run(session: Session, slug: str | None) -> TriageRun | None:
    """The latest run without a result (interrupted or ended with errors) that no live
    process is running, optionally of one incident."""
    query = select(TriageRun).where(
        col(TriageRun.finished_at).is_(None) | (TriageRun.state == "partial")
    )
    if slug:
        incident = get_incident(session, slug)
        if incident is None:
            return None
        query = query.where(TriageRun.incident_id == incident.id)
    for run in session.exec(query.order_by(col(TriageRun.id).desc())):
        if not owner_alive(run):
            return run
    return None


@dataclass(frozen=True)
class RunCandidate:
    """An unfinished run, as `--resume` chooses among them."""

    id: int
    slug: str
    state: str
    started: str
    plan: JsonObject
    live: bool
    owner: str


def resumable_runs(session: Session, slug: str | None = None) -> list[RunCandidate]:
    """Unfinished runs (interrupted, abandoned, ended with errors, or still running),
    newest first, optionally of one incident; `live` marks those a live process runs."""
    mark_stale_runs(session)
    query = select(TriageRun, Incident.slug).join(
        Incident, col(Incident.id) == TriageRun.incident_id
    )
    query = query.where(col(TriageRun.finished_at).is_(None) | (TriageRun.state == "partial"))
    if slug:
        query = query.where(Incident.slug == slug)
    out = []
    for run, run_slug in session.exec(query.order_by(col(TriageRun.id).desc()).limit(200)):
        assert run.id is not None
        owner = RunOwner.of(run)
        out.append(
            RunCandidate(
                id=run.id,
                slug=str(run_slug),
                state=run.state,
                started=run.started_at.isoformat(timespec="seconds") if run.started_at else "",
                plan=dict(run.plan or {}),
                live=owner_alive(run),
                owner=owner.describe() if owner else "unknown process",
            )
        )
    return out


def run_incident_slug(session: Session, run: TriageRun) -> str:
    incident = session.get(Incident, run.incident_id)
    if incident is None:
        raise LookupError(f"run {run.id}: its incident is gone")
    return incident.slug


def latest_diagnosis(session: Session, slug: str) -> JsonObject | None:
    """The result of the incident's latest run that has one."""
    incident = get_incident(session, slug)
    if incident is None:
        return None
    for run in session.exec(
        select(TriageRun)
        .where(TriageRun.incident_id == incident.id)
        .order_by(col(TriageRun.id).desc())
    ):
        if run.result and run.result.get("incident"):
            return dict(run.result)
    return None
