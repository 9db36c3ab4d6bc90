"""Several proxy replicas sharing one PostgreSQL knowledge base open one incident per failure
signature, never two (advisory lock + unique signature key), and keep every exchange."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from proxy_fakes import raw_record
from sqlmodel import select

from kb.domain.live import LiveAlarm
from kb.models import Incident, LiveSignature
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.proxy import Recorder

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(postgres_cluster) -> str:  # type: ignore[no-untyped-def]
    url = postgres_cluster.new_database()
    Store(url).close()  # migrate once, before the replicas start
    return url


def test_two_replicas_on_postgres_open_exactly_one_incident(pg_url: str, tmp_path: Path) -> None:
    replicas = [
        Recorder(
            pg_url,
            spool_path=tmp_path / f"spool-{name}.jsonl",
            replica=name,
            flush_seconds=0.01,
            batch_size=4,
        )
        for name in ("replica-a", "replica-b")
    ]
    start = threading.Barrier(2)

    def feed(recorder: Recorder, name: str) -> None:
        start.wait()
        now = time.time()
        for i in range(24):
            content = "" if i % 2 else "A complete and useful answer to the question."
            recorder.submit(raw_record(f"{name}-{i:03d}", content, at=now + i * 0.001))

    for recorder in replicas:
        recorder.start()
    threads = [threading.Thread(target=feed, args=(r, r.replica)) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for recorder in replicas:
        recorder.flush()
        recorder.stop()
    store = Store(pg_url)
    try:
        with store.session(readonly=True) as session:
            incidents = session.exec(select(Incident)).all()
            signatures = session.exec(select(LiveSignature)).all()
            total = live.count_exchanges(session)
    finally:
        store.close()
    assert total == 48
    assert len(incidents) == 1 and len(signatures) == 1
    assert signatures[0].signature == "empty-content|2xx"
    assert sum(len(r.opened) for r in replicas) == 1


def test_concurrent_openers_of_one_signature_get_one_incident(pg_url: str) -> None:
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def opener(name: str) -> None:
        store = Store(pg_url, migrate=False)
        try:
            barrier.wait()
            with store.session() as session:
                _, opened = liveincidents.open_incident(
                    session,
                    LiveAlarm(
                        model="m",
                        signature="empty-content|2xx",
                        kinds=("empty-content",),
                        title="Live: empty-content",
                        summary="s",
                        upstream={},
                        detection={},
                        examples=(),
                        opened_by=name,
                    ),
                )
                time.sleep(0.2)  # hold the transaction open: the others must wait, not insert
            results.append(opened)
        finally:
            store.close()

    threads = [threading.Thread(target=opener, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]
