"""Benchmark (not a timed test): the Incidents page over 10,000 incidents, rendered by AppTest.

Target on this machine: under 2 s per render. The page shows one window of 50 rows and
pushes every filter into SQL, so its cost should not grow with the number of incidents.
Run with `make bench` (pytest -m bench -s).
"""

from __future__ import annotations

import os
import platform
import random
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select
from streamlit.testing.v1 import AppTest

from kb.models import Cause, Decision, FamilyLink, Incident, Symptom
from kb.repo.store import Store
from triage.catalogue import catalogue as process_catalogue
from triage.ui import data

# The causes of the first catalogue (numbers 0-5), as the published numbers used.
CATALOGUE_IDS = [c.id for c in process_catalogue().causes if c.number < 6]

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")
INCIDENTS = 10_000
TARGET_SECONDS = 2.0
FINDINGS = [
    "empty-content",
    "length-stop",
    "broken-tool-call",
    "runaway-reasoning",
    "http-error",
    "slow-response",
    "intermittent",
]
MODELS = ["gemma-4-31b-it", "qwen3-30b-a3b", "llama-3.3-70b", "mistral-small-24b", "phi-4"]


def populate(store: Store, count: int, seed: int = 7) -> None:
    """`count` incidents with symptoms, causes, decisions and a few family links (core inserts)."""
    rng = random.Random(seed)
    start = date(2024, 1, 1)
    now = datetime(2026, 11, 1, tzinfo=timezone.utc)
    incidents, symptoms, causes, decisions = [], [], [], []
    for number in range(1, count + 1):
        opened = start + timedelta(days=rng.randrange(0, 1000))
        model = rng.choice(MODELS)
        kinds = rng.sample(FINDINGS, rng.randint(1, 3))
        status = rng.choice(["open", "parked", "fixed", "closed"])
        incidents.append(
            {
                "id": number,
                "slug": f"{opened.isoformat()}-bench-{number}",
                "title": f"{model}: {' and '.join(kinds)} under load, build b{9000 + number % 900}",
                "opened_on": opened,
                "status": status,
                "summary": f"Bench incident {number}.",
                "impact": "",
                "model": model,
                "weights": "Q4_K_M",
                "server_build": "b9586",
                "flags": [],
                "stack": {},
                "timeline": [],
                "body": "",
                "source_file": "",
                "created_at": now,
                "updated_at": now,
            }
        )
        for index, kind in enumerate(kinds):
            symptoms.append(
                {
                    "incident_id": number,
                    "key": f"S{index + 1}",
                    "kind": kind,
                    "description": f"{kind} seen",
                    "observed": {},
                    "evidence_keys": [],
                }
            )
        for catalogue in rng.sample(CATALOGUE_IDS, 3):
            causes.append(
                {
                    "incident_id": number,
                    "key": catalogue,
                    "catalogue_id": catalogue,
                    "title": f"{catalogue} on {model}",
                    "status": rng.choice(["confirmed", "suspected", "rejected"]),
                    "basis": "measured",
                    "rationale": "",
                    "deciding_probe": "",
                }
            )
        if status in ("parked", "fixed"):
            decisions.append(
                {
                    "incident_id": number,
                    "kind": status.upper(),
                    "decided_at": datetime.combine(opened, datetime.min.time(), timezone.utc),
                    "decided_by": "bench",
                    "rationale": "bench decision",
                    "tradeoff": "",
                    "fix": "",
                    "verified": status == "fixed",
                    "revisit_on": opened + timedelta(days=90) if status == "parked" else None,
                    "revisit_triggers": [],
                    "evidence_keys": [],
                }
            )
    with store.session() as session:
        session.execute(insert(Incident), incidents)
        session.execute(insert(Symptom), symptoms)
        session.execute(insert(Cause), causes)
        session.execute(insert(Decision), decisions)
        cause_ids = [
            row[0]
            for row in session.execute(
                select(Cause.id).where(Cause.catalogue_id == "reasoning-exhausts-budget")
            ).all()
        ]
        links = [
            {"from_cause_id": a, "to_cause_id": b, "note": "bench family", "created_at": now}
            for a, b in zip(cause_ids[:200:2], cause_ids[1:200:2], strict=True)
        ]
        session.execute(insert(FamilyLink), links)


def timed_run(at: AppTest) -> float:
    began = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - began
    assert not at.exception, [e.value for e in at.exception]
    return elapsed


def test_incidents_page_with_10000_incidents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    store = Store(url)
    began = time.perf_counter()
    try:
        populate(store, INCIDENTS)
    finally:
        store.close()
    load_seconds = time.perf_counter() - began
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    try:
        at = AppTest.from_file(APP, default_timeout=120)
        results: list[tuple[str, float, Any]] = []
        results.append(("first render (cold: imports, store, migrations)", timed_run(at), None))
        results.append(("render (warm)", timed_run(at), None))
        at.selectbox(key="incidents_cause").set_value("reasoning-exhausts-budget")
        at.selectbox(key="incidents_cause_status").set_value("confirmed")
        results.append(("filter: cause confirmed", timed_run(at), None))
        at.selectbox(key="incidents_decision").set_value("PARKED")
        results.append(("+ filter: latest decision PARKED", timed_run(at), None))
        at.selectbox(key="incidents_cause").set_value("")
        at.selectbox(key="incidents_cause_status").set_value("")
        at.selectbox(key="incidents_decision").set_value("")
        results.append(("filters cleared", timed_run(at), None))
        at.get("pagination")[0].set_value(150)
        results.append(("page 150 of 200", timed_run(at), None))
        at.text_input(key="incidents_query").input("gemma empty content")
        results.append(("search: gemma empty content", timed_run(at), None))
        at.text_input(key="incidents_query").input("")
        family = data.families(data.get_store())[0].key
        at.selectbox(key="incidents_family").set_value(family)
        results.append(("filter: one family", timed_run(at), None))
        caption = at.caption[0].value
        at.switch_page("views/decisions.py")
        results.append(
            ("Decision log page (all decisions; parked states cold)", timed_run(at), None)
        )
        results.append(("Decision log page (parked states cached)", timed_run(at), None))
        [(slug, _title)] = data.recent_incidents(data.get_store(), limit=1)
        at.switch_page("views/incident.py")
        at.query_params["slug"] = slug
        results.append(("Incident page (one incident)", timed_run(at), None))
    finally:
        data.forget_stores()

    print(
        f"\nIncidents page, {INCIDENTS:,} incidents (SQLite) -- {platform.node()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s), "
        f"Python {platform.python_version()}"
    )
    print(f"  data load: {load_seconds:.1f} s")
    print(f"  {'render':<52} {'seconds':>8}  target < {TARGET_SECONDS:.0f} s")
    for label, seconds, _ in results:
        flag = "" if seconds < TARGET_SECONDS else "  over 2 s"
        print(f"  {label:<52} {seconds:8.3f}{flag}")
    print(f"  last caption: {caption}")
