"""The recorder: what the engine writes while a run goes on -- the incident and the run
row, each look's replies, the heartbeat, the run's state -- through kb functions
(kb/runs.py, kb/store.py), one transaction per call. No SQL in triage/. The decided run
is written by triage.engine.record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kb.domain.diagnosis import Finding
from kb.domain.records import Reply
from kb.jsontypes import JsonObject
from kb.repo import runs
from kb.repo.store import Store, get_incident
from triage.engine.servers import EngineError

__all__ = ["Recorder"]


@dataclass
class Recorder:
    store: Store
    actor: str
    incident_id: int = 0
    incident_slug: str = ""
    run_id: int | None = None
    evidence_keys: dict[str, str] = field(default_factory=dict)  # arm/observation -> key
    finished: bool = False  # the run's result is recorded

    def incident_exists(self, slug: str) -> bool:
        with self.store.session(readonly=True) as session:
            return get_incident(session, slug) is not None

    def prepare(
        self,
        slug: str | None,
        new: runs.NewIncident,
        causes: Sequence[runs.CauseSpec],
        *,
        exchange: JsonObject | None,
        findings: Sequence[Finding],
        plan: JsonObject | None,
    ) -> None:
        """Find or open the incident, add the catalogue causes, and (for a new run) store
        the exchange and open the run row -- one transaction."""
        with self.store.session() as session:
            incident = get_incident(session, slug) if slug else None
            if incident is None:
                incident = runs.new_incident(session, new)
            assert incident.id is not None
            self.incident_id, self.incident_slug = incident.id, incident.slug
            runs.ensure_causes(session, incident.id, causes, self.actor)
            if self.run_id is not None:
                try:  # never take over a run that a live process still runs
                    runs.claim_run(session, self.run_id)
                except runs.RunBusy as busy:
                    raise EngineError(f"{busy}; not resumed") from None
                return
            if exchange:
                self.evidence_keys["exchange"] = runs.record_exchange(
                    session, incident.id, exchange, findings
                )
            assert plan is not None
            plan = {**plan, "exchange_evidence": self.evidence_keys.get("exchange")}
            self.run_id = runs.start_run(session, incident.id, plan)

    def ensure_causes(self, causes: Sequence[runs.CauseSpec]) -> None:
        """Add causes to the incident (crash mode: the crash-only causes join)."""
        with self.store.session() as session:
            runs.ensure_causes(session, self.incident_id, causes, self.actor)

    def previous_replies(self) -> list[Reply]:
        assert self.run_id is not None
        with self.store.session(readonly=True) as session:
            return runs.run_replies(session, self.run_id)

    def record_replies(self, replies: Sequence[Reply]) -> None:
        assert self.run_id is not None
        with self.store.session() as session:
            runs.record_replies(session, self.incident_id, self.run_id, replies)

    def heartbeat(self) -> None:
        if self.run_id is None:
            return
        with self.store.session() as session:
            runs.heartbeat(session, self.run_id)

    def set_state(self, state: str, *, finished: bool = False) -> None:
        if self.run_id is None or self.finished:
            return  # a run whose result is recorded keeps its state
        with self.store.session() as session:
            runs.set_run_state(session, self.run_id, state, finished=finished)

    def keys(self, names: Sequence[str]) -> list[str]:
        return [self.evidence_keys[n] for n in names if n in self.evidence_keys]
