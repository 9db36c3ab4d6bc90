"""The knowledge base as one service: open it, read incidents, record what people decide.

The CLI, the UI and the proxy hold a `KnowledgeBase` and call its methods; typed records go
in and out (kb.service.records), each call is one transaction, and every database failure
arrives as a `StoreError` with one line to show (kb.service.errors). Nothing outside kb
touches SQL, a session or an ORM row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from pathlib import Path
from types import TracebackType

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from kb.domain.decisions import ParkedIncident
from kb.domain.errors import StoreError
from kb.domain.triggers import KindLookup, stored_trigger
from kb.filecheck import RecordError
from kb.jsontypes import JsonObject
from kb.repo import decisions as kb_decisions
from kb.repo import live as kb_live
from kb.repo.engine import database_url, describe_db_error, redact_url
from kb.repo.filerecord import list_records, load_record
from kb.repo.files import IMPORT_BATCH, export_incidents, import_files
from kb.repo.importbatch import ImportResult
from kb.repo.liveincidents import live_incidents
from kb.repo.runlog import evidence_runs, incident_runs
from kb.repo.store import (
    Store,
    count_orphan_evidence,
    get_incident,
    open_incident,
    record_status_change,
)
from kb.service import incidents as queries
from kb.service.errors import NotFoundError, OpenError, database_errors
from kb.service.records import (
    DecisionRequest,
    DecisionRow,
    Family,
    IncidentFilters,
    IncidentPage,
    IncidentRuns,
    IncidentTitle,
    LiveOverview,
    RecordedDecision,
    StatusChange,
)

PAGE_SIZE = 50


class KnowledgeBase:
    """One knowledge base (SQLite file or PostgreSQL) behind typed calls."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    def open(
        cls, url: str | None = None, *, readonly: bool | None = None, migrate: bool = True
    ) -> KnowledgeBase:
        """Open (and migrate) the knowledge base at `url` (default: TRIAGE_DATABASE_URL or the
        SQLite file in the data directory). A refusal keeps its StoreError; a database that
        cannot be reached raises OpenError naming the redacted URL."""
        return cls.opened_by(lambda where: Store(where, readonly=readonly, migrate=migrate), url)

    @classmethod
    def opened_by(
        cls, factory: Callable[[str | None], Store], url: str | None = None
    ) -> KnowledgeBase:
        """The knowledge base `factory(url)` opens (the proxy's store factory), with
        `open`'s errors."""
        try:
            return cls(factory(url))
        except StoreError:
            raise
        except SQLAlchemyError as exc:
            where, detail = redact_url(database_url(url)), describe_db_error(exc)
            raise OpenError(f"{where}: {detail}", url=where, detail=detail) from exc

    # ------------------------------------------------------------------ handle

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def readonly(self) -> bool:
        return self.store.readonly

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Database errors inside the block arrive as one-line `DatabaseError`s."""
        with database_errors(self.url, self.readonly):
            yield

    @contextmanager
    def transaction(self, *, readonly: bool = False) -> Iterator[Session]:
        """One transaction for kb's own modules (committed at the end, rolled back on any
        exception); database errors arrive as `DatabaseError`s."""
        with self.errors(), self.store.session(readonly=readonly) as session:
            yield session

    # ------------------------------------------------------------------ incidents

    def list_incidents(
        self, filters: IncidentFilters, *, page: int = 1, page_size: int = PAGE_SIZE
    ) -> IncidentPage:
        """One page of incidents, newest first (search hits: best first), with the columns
        the list shows."""
        with self.transaction(readonly=True) as session:
            return queries.list_incidents(session, filters, page=page, page_size=page_size)

    def families(self) -> list[Family]:
        """Every failure family (incidents linked by same-family causes), by first slug."""
        with self.transaction(readonly=True) as session:
            return queries.families(session)

    def recent_incidents(self, limit: int = 100) -> list[IncidentTitle]:
        """The most recently opened incidents, newest first."""
        with self.transaction(readonly=True) as session:
            return queries.recent_incidents(session, limit)

    def incident_record(self, slug: str) -> JsonObject | None:
        """The incident as its file's front matter (plus `body`); None for an unknown slug."""
        with self.transaction(readonly=True) as session:
            if get_incident(session, slug) is None:
                return None
            return load_record(session, slug)

    def require_record(self, slug: str) -> JsonObject:
        """As `incident_record`, but an unknown slug is a NotFoundError naming it."""
        record = self.incident_record(slug)
        if record is None:
            raise NotFoundError(f"no incident with slug {slug!r}")
        return record

    def summaries(
        self,
        *,
        status: str | None = None,
        cause: str | None = None,
        cause_status: str | None = None,
    ) -> list[JsonObject]:
        """Incident summaries, oldest first, as `triage incidents list --json` prints them."""
        with self.transaction(readonly=True) as session:
            return list_records(session, status=status, cause=cause, cause_status=cause_status)

    def orphan_count(self) -> int:
        """Captured exchanges attached to no incident."""
        with self.transaction(readonly=True) as session:
            return count_orphan_evidence(session)

    def open_incident(self, title: str, *, model: str = "", summary: str = "") -> str:
        """Open an incident by hand (status open); its new slug. The title is checked."""
        with self.transaction() as session:
            return open_incident(session, title, model=model, summary=summary).slug

    def import_files(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        dry_run: bool = False,
        batch: int = IMPORT_BATCH,
        progress: Callable[[int, int], None] | None = None,
        causes: Collection[str] | None = None,
    ) -> ImportResult:
        """Import incident files (all validated first; RecordError names the file/field);
        `causes`: the cause ids the installed catalogue knows."""
        with self.errors():
            return import_files(
                self.store, paths, dry_run=dry_run, batch=batch, progress=progress, causes=causes
            )

    def export_incidents(
        self, out_dir: str | os.PathLike[str], slugs: Iterable[str] | None = None
    ) -> tuple[list[Path], list[RecordError]]:
        """Write incidents (all, or `slugs`) as files: (paths written, records refused)."""
        with self.errors():
            return export_incidents(self.store, out_dir, slugs)

    def incident_runs(self, slug: str) -> IncidentRuns:
        """The incident's engine runs (newest first) and which run recorded each evidence."""
        with self.transaction(readonly=True) as session:
            return IncidentRuns(incident_runs(session, slug), evidence_runs(session, slug))

    # ------------------------------------------------------------------ decisions

    def decisions(self) -> list[DecisionRow]:
        """Every recorded decision in time order."""
        with self.transaction(readonly=True) as session:
            return queries.decisions(session)

    def parked(
        self, on: date, trigger_kinds: KindLookup | None = None, *, due_only: bool = False
    ) -> list[ParkedIncident]:
        """Parked incidents as of `on`: revisit date, triggers, whether due and why."""
        with self.transaction(readonly=True) as session:
            return kb_decisions.parked(session, on, due_only=due_only, trigger_kinds=trigger_kinds)

    def parked_incident(
        self, slug: str, on: date, trigger_kinds: KindLookup | None = None
    ) -> ParkedIncident | None:
        """One incident's parked-list entry as of `on` (None unless it is parked)."""
        with self.transaction(readonly=True) as session:
            incident = get_incident(session, slug)
            if incident is None or incident.status != "parked":
                return None
            return kb_decisions.parked_incident(session, incident, on, trigger_kinds)

    def record_decision(
        self, slug: str, decision: DecisionRequest, trigger_kinds: KindLookup | None = None
    ) -> RecordedDecision:
        """Record PARKED / FIXED / REOPENED (kb.repo.decisions' rules; the incident's status
        moves with it). A refused decision is a DecisionError saying what is missing."""
        with self.transaction() as session:
            row = kb_decisions.record_decision(
                session,
                slug,
                decision.kind,
                rationale=decision.rationale,
                tradeoff=decision.tradeoff,
                fix=decision.fix,
                by=decision.by,
                revisit_on=decision.revisit_on,
                triggers=[t.strip() for t in decision.triggers if t.strip()],
                evidence_keys=list(decision.evidence_keys),
                force=decision.force,
                at=decision.at,
                trigger_kinds=trigger_kinds,
            )
            incident = get_incident(session, slug)
            return RecordedDecision(
                slug=slug,
                kind=row.kind,
                at=row.decided_at,
                by=row.decided_by,
                rationale=row.rationale,
                tradeoff=row.tradeoff,
                fix=row.fix,
                verified=row.verified,
                revisit_on=row.revisit_on,
                triggers=tuple(stored_trigger(t) for t in row.revisit_triggers or ()),
                evidence_keys=tuple(row.evidence_keys or ()),
                incident_status=incident.status if incident is not None else "",
            )

    def change_cause_status(
        self,
        slug: str,
        cause_key: str,
        to_status: str,
        *,
        actor: str,
        rationale: str,
        evidence_keys: tuple[str, ...] | list[str] = (),
        at: datetime | None = None,
    ) -> StatusChange:
        """A person moves a cause to another status; kept in the cause's history like an
        engine change (kb.repo.store.record_status_change checks the status, actor, rationale
        and evidence ids). Moving a cause to the status it has is refused."""
        with self.transaction() as session:
            incident = get_incident(session, slug)
            if incident is None:
                raise NotFoundError(f"no incident with slug {slug!r}")
            cause = queries.find_cause(session, incident.id, cause_key)
            if cause is None:
                raise NotFoundError(f"{slug}: no cause {cause_key!r}")
            if cause.status == to_status:
                raise StoreError(f"cause {cause_key!r} is already {to_status}")
            change = record_status_change(
                session,
                cause,
                to_status,
                actor=actor.strip(),
                rationale=rationale.strip(),
                evidence_keys=list(evidence_keys),
                at=at,
            )
            return StatusChange(
                slug=slug,
                cause=cause_key,
                from_status=change.from_status,
                to_status=change.to_status,
                actor=change.actor,
                rationale=change.rationale,
                evidence_keys=tuple(change.evidence_keys or ()),
            )

    # ------------------------------------------------------------------ live

    def live_overview(self, since: datetime, until: datetime, bucket: timedelta) -> LiveOverview:
        """What the proxy recorded between `since` and `until` (rates per `bucket`)."""
        with self.transaction(readonly=True) as session:
            return LiveOverview(
                upstream=kb_live.latest_upstream(session),
                points=kb_live.series(session, since, until, bucket),
                cells=kb_live.cell_counts(session, since, until),
                opened=live_incidents(session),
            )
