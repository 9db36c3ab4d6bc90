"""Concurrent writers lose nothing: processes and threads writing evidence and incidents at
the same time, on SQLite (WAL, busy timeout, BEGIN IMMEDIATE) and PostgreSQL."""

from __future__ import annotations

import multiprocessing
import threading
import traceback
from datetime import date

from sqlalchemy import func
from sqlmodel import select

from kb.models import Cause, Evidence, Incident, Symptom
from kb.repo.family import IncidentSignature, incident_signature, refresh_signatures
from kb.repo.search import search
from kb.repo.store import Store, add_evidence, record_status_change, require_incident

SHARED = "2026-09-01-shared"
PROCESSES = 2
THREADS = 2
TRANSACTIONS = 20
NEW_INCIDENT_EVERY = 4


def write(url: str, writer: str, start: threading.Event | None = None) -> None:
    """One writer: evidence on the shared incident each transaction, sometimes a new incident.

    Each transaction is what a triage run or the UI does: a short write session.
    """
    store = Store(url, migrate=False)
    try:
        if start is not None:
            start.wait(timeout=60)
        for number in range(TRANSACTIONS):
            with store.session() as session:
                shared = require_incident(session, SHARED)
                symptom = Symptom(
                    incident_id=shared.id,
                    key=f"S-{writer}-{number}",
                    kind=f"kind-{writer}",
                    description=f"symptom {writer}x{number}",
                )
                # Half the transactions write the symptom first, half the evidence first:
                # different orders of the same rows must not deadlock.
                if number % 2:
                    session.add(symptom)
                    session.flush()
                add_evidence(
                    session,
                    incident_id=shared.id,
                    kind="observation",
                    summary=f"observation {writer}x{number}end from a concurrent writer",
                )
                if not number % 2:
                    session.add(symptom)
                    session.flush()
                if number % NEW_INCIDENT_EVERY == 0:
                    incident = Incident(
                        slug=f"2026-09-02-{writer}-{number}",
                        title=f"incident {writer}x{number}",
                        opened_on=date(2026, 9, 2),
                    )
                    session.add(incident)
                    session.flush()
                    assert incident.id is not None
                    session.add(
                        Symptom(incident_id=incident.id, key="S1", kind="timeout", description="t")
                    )
                    evidence = add_evidence(
                        session, incident_id=incident.id, kind="probe", summary="probe result"
                    )
                    cause = Cause(
                        incident_id=incident.id,
                        key="token-limit",
                        catalogue_id="token-limit",
                        title="limit",
                        status="suspected",
                    )
                    record_status_change(
                        session,
                        cause,
                        "confirmed",
                        actor=writer,
                        rationale="probe",
                        evidence_keys=[evidence.key],
                    )
            if number % 5 == 4:
                with store.session() as session:
                    refresh_signatures(session)
    finally:
        store.close()


def _process_main(url: str, writer: str, start: object, errors: object) -> None:
    try:
        start.wait(timeout=60)  # type: ignore[attr-defined]
        write(url, writer)
    except BaseException:
        errors.put(f"{writer}: {traceback.format_exc()}")  # type: ignore[attr-defined]
        raise


def test_concurrent_writers_lose_nothing(store: Store) -> None:
    with store.session() as session:
        session.add(Incident(slug=SHARED, title="shared", opened_on=date(2026, 9, 1)))

    context = multiprocessing.get_context("spawn")
    start = context.Event()
    errors = context.Queue()
    processes = [
        context.Process(target=_process_main, args=(store.url, f"p{i}", start, errors))
        for i in range(PROCESSES)
    ]
    thread_errors: list[str] = []
    thread_start = threading.Event()

    def thread_main(writer: str) -> None:
        try:
            write(store.url, writer, thread_start)
        except BaseException:
            thread_errors.append(f"{writer}: {traceback.format_exc()}")

    threads = [threading.Thread(target=thread_main, args=(f"t{i}",)) for i in range(THREADS)]
    for process in processes:
        process.start()
    for thread in threads:
        thread.start()
    start.set()
    thread_start.set()
    for thread in threads:
        thread.join(timeout=240)
    for process in processes:
        process.join(timeout=240)
    reported = []
    while not errors.empty():
        reported.append(errors.get())
    assert not thread_errors, "\n".join(thread_errors)
    assert not reported, "\n".join(reported)
    assert [process.exitcode for process in processes] == [0] * PROCESSES

    writers = [f"p{i}" for i in range(PROCESSES)] + [f"t{i}" for i in range(THREADS)]
    new_per_writer = len(range(0, TRANSACTIONS, NEW_INCIDENT_EVERY))
    with store.session(readonly=True) as session:
        shared = require_incident(session, SHARED)
        keys = session.exec(select(Evidence.key).where(Evidence.incident_id == shared.id)).all()
        expected = len(writers) * TRANSACTIONS
        assert sorted(keys, key=lambda k: int(k[1:])) == [f"E{n}" for n in range(1, expected + 1)]
        symptoms = session.exec(select(Symptom.key).where(Symptom.incident_id == shared.id)).all()
        assert len(symptoms) == expected
        # A signature marked fresh is the incident's current signature (no lost staleness).
        row = session.get(IncidentSignature, shared.id)
        assert row is not None
        if not row.stale:
            assert set(row.kinds.split(",")) == incident_signature(session, SHARED).kinds
        assert incident_signature(session, SHARED).kinds == {f"kind-{w}" for w in writers}
        incidents = session.exec(select(func.count()).select_from(Incident)).one()
        assert incidents == 1 + len(writers) * new_per_writer
        confirmed = session.exec(
            select(func.count()).select_from(Cause).where(Cause.status == "confirmed")
        ).one()
        assert confirmed == len(writers) * new_per_writer
        # The search index saw every writer's evidence too (triggers under concurrency).
        for writer in writers:
            for number in range(TRANSACTIONS):
                hits = search(session, f"{writer}x{number}end concurrent")
                assert [hit.slug for hit in hits] == [SHARED], (writer, number)
