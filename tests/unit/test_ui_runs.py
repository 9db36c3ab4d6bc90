"""One engine run at a time in the UI: kb.repo.runlog, triage.ui.runs, the cause graph's arm
nodes, and the Incident page's run selector -- over a real SQLite knowledge base written
through the same kb.repo.runs functions the engine's recorder uses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kb.domain.records import ArmSummary
from kb.repo import runs as kb_runs
from kb.repo.files import load_record
from kb.repo.runlog import evidence_runs, incident_runs
from kb.repo.store import Store, add_evidence
from kb.service import KnowledgeBase
from triage.graph import LABEL_WIDTH, build_graph, to_dot
from triage.ui import data
from triage.ui.runs import ALL_RUNS, load_runs, record_for_run

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")
CAUSE = "reasoning-exhausts-budget"
OTHER = "spec-decoding-divergence"


def arm(name: str, failures: int, n: int, decision: str) -> dict[str, Any]:
    rate = failures / n
    return ArmSummary(
        arm=name,
        variant=name,
        level="request",
        n=n,
        failures=failures,
        rate=rate,
        ci95=[max(0.0, rate - 0.2), min(1.0, rate + 0.2)],
        p_value=0.01,
        p_less=0.005,
        decision=decision,
    ).to_dict()


def record_run(
    store: Store, incident_id: int, arms: list[dict[str, Any]], verdicts: list[kb_runs.VerdictRow]
) -> int:
    """One run as the recorder writes it: arm evidence with the run id, then the verdicts
    citing the arms by name (translated to their evidence keys)."""
    with store.session() as session:
        run_id = kb_runs.start_run(session, incident_id, {"arms": [a["arm"] for a in arms]})
        keys = {}
        for payload in arms:
            evidence = add_evidence(
                session,
                incident_id=incident_id,
                kind="measurement",
                summary=f"arm {payload['arm']}: {payload['failures']}/{payload['n']} failed",
                payload=payload,
                source="triage diagnose",
                run_id=run_id,
            )
            keys[payload["arm"]] = evidence.key
        rows = [
            kb_runs.VerdictRow(
                v.cause,
                v.status,
                v.rationale,
                [keys[a] for a in v.supports],
                [keys[a] for a in v.refutes],
                v.deciding_probe,
                v.basis,
            )
            for v in verdicts
        ]
        kb_runs.apply_verdicts(session, incident_id, run_id, rows, "engine")
        kb_runs.finish_run(
            session,
            run_id,
            "done",
            {"incident": "x", "causes": [{"id": v.cause, "status": v.status} for v in verdicts]},
        )
    return run_id


@pytest.fixture
def two_runs(tmp_path: Path) -> Iterator[tuple[Store, str, int, int]]:
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    with store.session() as session:
        incident = kb_runs.new_incident(
            session, kb_runs.NewIncident(model="drill-gemma", kinds=["empty-content"])
        )
        assert incident.id is not None
        incident_id, slug = incident.id, incident.slug
        kb_runs.ensure_causes(
            session,
            incident_id,
            [
                kb_runs.CauseSpec(CAUSE, "Reasoning eats the token budget"),
                kb_runs.CauseSpec(OTHER, "Speculative decoding changes committed tokens"),
            ],
            "engine",
        )
        add_evidence(
            session,
            incident_id=incident_id,
            kind="exchange",
            summary="the captured failing exchange",
            payload={"status": 200},
        )
    first = record_run(
        store,
        incident_id,
        [arm("baseline", 8, 8, "baseline"), arm("thinking-off", 4, 8, "undecided")],
        [kb_runs.VerdictRow(CAUSE, "suspected", "not yet", [], [], "thinking-off", "measured")],
    )
    second = record_run(
        store,
        incident_id,
        [
            arm("baseline", 16, 16, "baseline"),
            arm("thinking-off", 0, 16, "removes"),
            arm("spec-off", 16, 16, "keeps"),
        ],
        [
            kb_runs.VerdictRow(
                CAUSE, "confirmed", "thinking off removes it", ["thinking-off"], [], "thinking-off"
            ),
            kb_runs.VerdictRow(
                OTHER, "rejected", "spec off keeps it", [], ["spec-off"], "spec-off"
            ),
        ],
    )
    try:
        yield store, slug, first, second
    finally:
        store.close()


def test_runlog_lists_runs_newest_first_and_the_run_of_each_evidence(two_runs: Any) -> None:
    store, slug, first, second = two_runs
    with store.session(readonly=True) as session:
        runs = incident_runs(session, slug)
        owners = evidence_runs(session, slug)
        assert incident_runs(session, "no-such-incident") == []
    assert [r.id for r in runs] == [second, first]
    assert runs[0].state == "done" and runs[0].result["causes"][0]["status"] == "confirmed"
    assert sorted(owners.values()) == [first, first, second, second, second]
    assert "E1" not in owners  # the captured exchange belongs to no run


def test_record_for_run_keeps_one_runs_evidence_and_the_shared_exchange(two_runs: Any) -> None:
    store, slug, first, second = two_runs
    with store.session(readonly=True) as session:
        record = load_record(session, slug)
    runs = load_runs(KnowledgeBase(store), slug)
    assert runs.latest == second and "latest" in runs.label(second)
    narrowed = record_for_run(record, runs, first)
    summaries = [e["summary"] for e in narrowed["evidence"]]
    assert summaries == [
        "the captured failing exchange",
        "arm baseline: 8/8 failed",
        "arm thinking-off: 4/8 failed",
    ]
    cause = next(c for c in narrowed["causes"] if c["id"] == CAUSE)
    assert cause["evidence"] == []  # run 1 cited nothing; run 2's link is not shown here
    assert record_for_run(record, runs, ALL_RUNS) is record
    assert len(record["evidence"]) == 6


def test_graph_attaches_every_arm_to_what_it_decides_one_run_at_a_time(two_runs: Any) -> None:
    store, slug, _, second = two_runs
    with store.session(readonly=True) as session:
        record = load_record(session, slug)
    graph = build_graph(record_for_run(record, load_runs(KnowledgeBase(store), slug), second))
    without_evidence = graph.subgraph(
        [n for n, d in graph.nodes(data=True) if d.get("kind") != "evidence"]
    )
    probes = [n for n, d in without_evidence.nodes(data=True) if d.get("kind") == "probe"]
    assert sorted(probes) == ["probe:baseline", "probe:spec-off", "probe:thinking-off"]
    for probe in probes:  # no arm node floats unconnected when evidence nodes are hidden
        assert without_evidence.degree(probe) > 0, probe
    relations = {(s, t): d["relation"] for s, t, d in without_evidence.edges(data=True)}
    assert relations[("probe:thinking-off", f"cause:{CAUSE}")] == "supports"
    assert relations[("probe:spec-off", f"cause:{OTHER}")] == "refutes"
    assert relations[(f"incident:{slug}", "probe:baseline")] == "measured"
    dot = to_dot(without_evidence)
    # This run's numbers only (run 1 had thinking-off at 4/8).
    assert '"probe:thinking-off" [label="thinking-off:\\n0/16 failed"' in dot
    assert "4/8" not in dot
    # Readable at default zoom: left to right, large type, labels wrapped.
    assert "rankdir=LR;" in dot and "fontsize=18" in dot
    labels = re.findall(r'label="([^"]*)", shape', dot)
    assert all(len(line) <= LABEL_WIDTH for label in labels for line in label.split("\\n"))


@pytest.fixture
def page_url(two_runs: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int, int]]:
    store, slug, first, second = two_runs
    monkeypatch.setenv("TRIAGE_DATABASE_URL", str(store.engine.url))
    yield slug, first, second
    data.forget_stores()


def open_incident(slug: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/incident.py")
    at.query_params["slug"] = slug
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def arms_table(at: AppTest) -> Any:
    return next(df.value for df in at.dataframe if "k/n" in df.value.columns)


def test_incident_page_run_selector(page_url: tuple[str, int, int]) -> None:
    slug, first, second = page_url
    at = open_incident(slug)
    picker = at.selectbox(key="run_pick")
    assert picker.value == second  # the latest run by default
    arms = arms_table(at)
    assert "Run" not in arms.columns
    assert list(arms["k/n"]) == ["16/16", "0/16", "16/16"]
    causes = next(df.value for df in at.dataframe if "Deciding probe" in df.value.columns)
    assert dict(zip(causes["Cause"], causes["This run"], strict=True)) == {
        CAUSE: "confirmed",
        OTHER: "rejected",
    }
    # Evidence payloads start collapsed.
    assert at.json and all(not j.proto.expanded for j in at.json)

    picker.set_value(first).run()
    assert list(arms_table(at)["k/n"]) == ["8/8", "4/8"]
    assert "0/16" not in at.get("graphviz_chart")[0].proto.spec

    at.selectbox(key="run_pick").set_value(ALL_RUNS).run()
    arms = arms_table(at)
    assert list(arms["Run"]) == [first, first, second, second, second]
    dot = at.get("graphviz_chart")[0].proto.spec  # the graph still shows one run
    assert "0/16" in dot and "4/8" not in dot
    [chart] = at.get("vega_lite_chart")
    spec = str(chart.proto)
    assert "4/8" not in spec and "0/16" in spec
