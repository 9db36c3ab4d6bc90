"""Family matching of live failures: a failure signature the proxy detects that is the same
failure as an open or parked incident opened by other means (a capture, a diagnosis, by
hand) adds its rate and examples to that incident instead of opening a second one; when
nothing matches, the proxy opens its own. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kb_rows import add_incident
from proxy_fakes import raw_record
from sqlmodel import select

from kb.models import Evidence, Incident, LiveSignature, utcnow
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.proxy import Recorder

GEMMA = "gemma-4-e2b-it-Q4_K_M.gguf"


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'kb.db'}"
    else:
        url = request.getfixturevalue("postgres_cluster").new_database()
    Store(url).close()  # migrated
    return url


def _seed(db_url: str, incidents: list[dict[str, Any]]) -> dict[str, int]:
    store = Store(db_url, migrate=False)
    try:
        with store.session() as session:
            ids = {}
            for spec in incidents:
                incident = add_incident(session, **spec)
                assert incident.id is not None
                ids[incident.slug] = incident.id
            return ids
    finally:
        store.close()


def _feed(
    db_url: str, tmp_path: Path, model: str = GEMMA, n: int = 12, prefix: str = "k"
) -> Recorder:
    """n exchanges of `model` through a recorder, every other one answered empty."""
    recorder = Recorder(
        db_url, spool_path=tmp_path / "spool.jsonl", replica="replica-a", flush_seconds=0.01
    )
    recorder.start()
    now = time.time()
    try:
        for i in range(n):
            content = "" if i % 2 else "A complete and useful answer to the question."
            record = raw_record(f"{prefix}-{i:03d}", content, at=now + i * 0.001)
            record["identity"] = {**record["identity"], "model": model}
            recorder.submit(record)
        recorder.flush(n)
    finally:
        recorder.stop()
    return recorder


def _state(db_url: str) -> tuple[list[Incident], list[LiveSignature], list[Evidence]]:
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            return (
                list(session.exec(select(Incident).order_by(Incident.id)).all()),
                list(session.exec(select(LiveSignature)).all()),
                list(session.exec(select(Evidence).where(Evidence.kind == "exchange")).all()),
            )
    finally:
        store.close()


# Incidents the live failure (empty-content from a Gemma model) must NOT attach to.
DECOYS = [
    {  # same failure, same family, but fixed
        "slug": "2026-05-01-gemma-empty-fixed",
        "title": "Gemma answered empty (fixed)",
        "status": "fixed",
        "model": GEMMA,
        "symptoms": [("empty-content", "empty answer")],
    },
    {  # same failure, another model family
        "slug": "2026-05-02-qwen-empty",
        "title": "Qwen answers empty",
        "model": "Qwen3-8B-Q4_K_M.gguf",
        "symptoms": [("empty-content", "empty answer")],
    },
    {  # same family, another failure
        "slug": "2026-05-03-gemma-tool-markup",
        "title": "Gemma leaks tool markup",
        "model": GEMMA,
        "symptoms": [("tool-markup-leaked", "markup in content")],
    },
]


@pytest.mark.parametrize("status", ["open", "parked"])
def test_a_live_failure_adds_evidence_to_the_matching_incident_instead_of_opening_one(
    db_url: str, tmp_path: Path, status: str
) -> None:
    target = {
        "slug": "2026-06-10-gemma4-empty-response",
        "title": "Gemma 4 answers empty",
        "status": status,
        "model": "gemma-4-qat.gguf",
        "server_build": "b9589",  # an older build: the live one is b11434
        "symptoms": [("empty-content", "empty answer"), ("finish-length", "cut at max_tokens")],
    }
    ids = _seed(db_url, [*DECOYS, target])
    recorder = _feed(db_url, tmp_path)

    incidents, signatures, evidence = _state(db_url)
    assert len(incidents) == len(DECOYS) + 1  # nothing opened
    assert recorder.opened == []  # so no auto-diagnose either
    (signature,) = signatures
    assert signature.signature == "empty-content|2xx"
    assert signature.incident_id == ids[target["slug"]]
    assert signature.opened_by == "matched:replica-a"
    assert signature.latest_exchange_key  # first and latest examples kept
    assert evidence and {e.incident_id for e in evidence} == {ids[target["slug"]]}
    (matched,) = [i for i in incidents if i.slug == target["slug"]]
    assert matched.status == status  # evidence added; the decision is the team's
    assert any("live failure matched by replica-a" in e["event"] for e in matched.timeline)
    # The incident now counts live failures (a parked incident's revisit trigger reads it).
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            counts = live.incident_live_counts(
                session, ids[target["slug"]], utcnow() - timedelta(1)
            )
            listed = [row.slug for row in liveincidents.live_incidents(session)]
    finally:
        store.close()
    assert counts == (6, 12)
    assert listed == [target["slug"]]


def test_without_a_match_the_proxy_opens_its_own_incident_and_keeps_using_it(
    db_url: str, tmp_path: Path
) -> None:
    _seed(db_url, DECOYS)
    first = _feed(db_url, tmp_path)
    incidents, signatures, _ = _state(db_url)
    assert len(incidents) == len(DECOYS) + 1 and len(first.opened) == 1
    (signature,) = signatures
    assert signature.opened_by == "replica-a"
    opened = [i for i in incidents if i.id == signature.incident_id][0]
    assert opened.slug not in {d["slug"] for d in DECOYS}
    assert opened.status == "open"


def test_an_incident_the_proxy_opened_is_not_a_family_match_for_another_model(
    db_url: str, tmp_path: Path
) -> None:
    """A proxy-opened incident is tracked by its own signature; another Gemma file with the
    same failure gets its own live incident, not evidence on the first one."""
    _feed(db_url, tmp_path)
    _feed(db_url, tmp_path / "second", model="gemma-3-27b-it-Q4_0.gguf", prefix="j")
    incidents, signatures, _ = _state(db_url)
    assert len(incidents) == 2 and len(signatures) == 2
    assert all(not s.opened_by.startswith("matched:") for s in signatures)


def test_the_most_similar_matching_incident_gets_the_evidence(db_url: str) -> None:
    """Two open Gemma incidents with the failure: the one on the live build is the match; an
    incident lacking one of the signature's kinds is none."""
    ids = _seed(
        db_url,
        [
            {
                "slug": "2026-06-01-gemma-empty-on-b11434",
                "title": "Gemma empty on the current build",
                "model": GEMMA,
                "server_build": "b11434",
                "symptoms": [("empty-content", "empty"), ("tool-markup-leaked", "markup")],
            },
            {
                "slug": "2026-06-02-gemma-empty-on-b9589",
                "title": "Gemma empty on the old build",
                "model": GEMMA,
                "server_build": "b9589",
                "symptoms": [("empty-content", "empty"), ("tool-markup-leaked", "markup")],
            },
            {
                "slug": "2026-06-03-gemma-empty-only",
                "title": "Gemma empty, no markup",
                "model": GEMMA,
                "server_build": "b11434",
                "symptoms": [("empty-content", "empty")],
            },
        ],
    )
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            both = ["empty-content", "tool-markup-leaked"]
            found = liveincidents.family_match(
                session, model=GEMMA, kinds=both, upstream={"build": "b11434-abc"}
            )
            older = liveincidents.family_match(
                session, model=GEMMA, kinds=both, upstream={"build": "b9589"}
            )
            unknown = liveincidents.family_match(
                session, model="model.gguf", kinds=both, upstream={"build": "b11434"}
            )
    finally:
        store.close()
    assert found is not None and found.id == ids["2026-06-01-gemma-empty-on-b11434"]
    assert older is not None and older.id == ids["2026-06-02-gemma-empty-on-b9589"]
    assert unknown is None  # no model family known: nothing to match on
