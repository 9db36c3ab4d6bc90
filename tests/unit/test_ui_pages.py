"""Each page of the web UI, run headless with Streamlit's AppTest, asserting what a user sees.

The knowledge base is a fresh SQLite file with the incidents in incidents/ imported; the
clock the overdue logic reads is pinned with TRIAGE_TODAY.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kb.domain.diagnosis import Diagnosis
from kb.repo.files import import_paths
from kb.repo.store import Store
from kb.service import KnowledgeBase
from triage.graph import STATUS_COLOURS
from triage.ui import actions, data
from triage.ui.text import md_unescape

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")
REFERENCE = "2026-06-10-gemma4-empty-response"
QWEN = (
    "2026-05-01-qwen-echo-response-latency",
    "2026-05-01-qwen-internal-tool-run-to-completion",
)
BEFORE_REVISIT = "2026-07-01"  # the reference incident is parked until 2026-09-10
AFTER_REVISIT = "2026-09-20"
TIMEOUT = 60


@pytest.fixture
def kb_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        import_paths(store, [REPO / "incidents"])
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    monkeypatch.setenv("TRIAGE_TODAY", BEFORE_REVISIT)
    yield url
    data.forget_stores()


def open_page(page: str, **query: str) -> AppTest:
    """Run the app, switch to `views/<page>.py` with the query parameters, run again."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    if page != "incidents":
        at.switch_page(f"views/{page}.py")
    at.query_params.update(query)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest, kind: str) -> list[str]:
    """What the user reads in every element of one kind (Markdown escapes removed)."""
    return [md_unescape(str(element.value)) for element in at.get(kind)]


TABLE_COLUMNS = {  # read-only st.dataframe has no key in AppTest: find it by a column
    "incidents_table": "Confirmed causes",
    "causes_table": "Deciding probe",
    "history_table": "What",
    "evidence_table": "Summary",
    "arms_table": "k/n",
    "decisions_table": "Revisit state",
}


def table(at: AppTest, key: str) -> Any:
    column = TABLE_COLUMNS[key]
    return next(df.value for df in at.dataframe if column in df.value.columns)


# --------------------------------------------------------------------------- Incidents


def test_incidents_page_lists_status_findings_causes_and_decision(kb_url: str) -> None:
    at = open_page("incidents")
    assert [t.value for t in at.title] == ["Incidents"]
    rows = table(at, "incidents_table")
    assert list(rows["Incident"]) == [REFERENCE, *sorted(QWEN, reverse=True)]
    reference = rows[rows["Incident"] == REFERENCE].iloc[0]
    assert reference["Status"] == "parked"
    assert str(reference["Opened"]) == "2026-06-10"
    assert reference["Decision"] == "PARKED"
    assert str(reference["Revisit on"]) == "2026-09-10"
    assert reference["Confirmed causes"] == "reasoning-exhausts-budget"
    assert "empty-content" in reference["Findings"]
    assert "3 incident(s)" in at.caption[0].value


@pytest.mark.parametrize(
    ("widget", "key", "value", "expected"),
    [
        ("multiselect", "incidents_status", ["closed"], sorted(QWEN, reverse=True)),
        ("selectbox", "incidents_decision", "PARKED", [REFERENCE]),
        ("selectbox", "incidents_decision", "none", sorted(QWEN, reverse=True)),
        ("selectbox", "incidents_cause", "quantized-weights", [REFERENCE]),
    ],
)
def test_incidents_page_filters(
    kb_url: str, widget: str, key: str, value: Any, expected: list[str]
) -> None:
    at = open_page("incidents")
    getattr(at, widget)(key=key).set_value(value)
    at.run()
    assert not at.exception
    assert list(table(at, "incidents_table")["Incident"]) == expected


def test_incidents_page_cause_filter_offers_every_registered_cause(kb_url: str) -> None:
    from triage.catalogue import catalogue

    options = open_page("incidents").selectbox(key="incidents_cause").options
    assert options[1:] == list(catalogue().causes.ids())  # after "any cause"
    assert {"cpu-backend", "kv-cache-quant", "schema-not-enforced"} <= set(options)


def test_incidents_page_family_filter(kb_url: str) -> None:
    at = open_page("incidents")
    family = at.selectbox(key="incidents_family")
    labels = [label for label in family.options if label != "any family"]
    assert len(labels) == 1 and labels[0].startswith("reasoning-exhausts-budget")
    family.set_value(sorted([REFERENCE, *QWEN])[0])  # a family is keyed by its first slug
    at.run()
    assert sorted(table(at, "incidents_table")["Incident"]) == sorted([REFERENCE, *QWEN])


def test_incidents_page_cause_status_filter_and_search(kb_url: str) -> None:
    at = open_page("incidents")
    at.selectbox(key="incidents_cause").set_value("quantized-weights")
    at.selectbox(key="incidents_cause_status").set_value("confirmed")
    at.run()
    assert table(at, "incidents_table").empty
    assert "0 incident(s)" in at.caption[0].value

    at = open_page("incidents")
    at.text_input(key="incidents_query").input("empty content finish length thinking")
    at.run()
    rows = table(at, "incidents_table")
    assert list(rows["Incident"])[0] == REFERENCE
    assert "«" in rows.iloc[0]["Match"]  # the snippet marks the matched words


def test_incidents_page_paginates(kb_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "PAGE_SIZE", 2)
    at = open_page("incidents")
    assert len(table(at, "incidents_table")) == 2
    assert "page 1 of 2" in at.caption[0].value
    at.get("pagination")[0].set_value(2)
    at.run()
    assert list(table(at, "incidents_table")["Incident"]) == [sorted(QWEN)[0]]


# --------------------------------------------------------------------------- Incident

REFERENCE_CAUSES = {
    "reasoning-exhausts-budget": "confirmed",
    "quantized-weights": "rejected",
    "speculative-decoding": "suspected",
    "server-build": "suspected",
    "output-parsing": "suspected",
}


def test_incident_page_shows_the_diagnosis(kb_url: str) -> None:
    at = open_page("incident", slug=REFERENCE)
    assert md_unescape(at.title[0].value).startswith("Gemma 4 on llama-server: empty responses")
    causes = table(at, "causes_table")
    statuses = dict(zip(causes["Cause"], causes["Status"], strict=True))
    assert {k: statuses[k] for k in REFERENCE_CAUSES} == REFERENCE_CAUSES
    # Confirmed first, then suspected, then rejected; the inferred sub-hypothesis is kept.
    assert list(causes["Status"]) == sorted(
        causes["Status"], key=["confirmed", "suspected", "rejected"].index
    )
    assert statuses["qat-flipped-thinking-default"] == "suspected"
    markdown = texts(at, "markdown")
    assert any(m.startswith("#### :red[:material/check_circle:] Confirmed (1)") for m in markdown)
    assert any(m.startswith("#### :orange[:material/help:] Suspected (4)") for m in markdown)
    assert any(m.startswith("#### :gray[:material/cancel:] Rejected (1)") for m in markdown)
    # The rationale and the evidence behind each cause, with the numbers.
    assert any("reasoning_len=2797, content_len=0, finish_reason=length" in m for m in markdown)
    assert any("content_len=687, finish_reason=stop" in m for m in markdown)
    labels = [md_unescape(e.label) for e in at.expander]
    assert "The QAT Q4 weights made the model dumber · measured" in labels
    assert at.json, "evidence payloads are shown as JSON"
    # The PARKED decision, with its revisit date and triggers.
    info = texts(at, "info")
    assert any(i.startswith("**PARKED** 2026-06-10 by operator -- Gemma is non-core") for i in info)
    assert any("Revisit on 2026-09-10" in i and "a new llama-server build" in i for i in info)
    assert not at.error, "not overdue before the revisit date"


def test_incident_page_graph_has_the_right_nodes(kb_url: str) -> None:
    at = open_page("incident", slug=REFERENCE)
    [chart] = at.get("graphviz_chart")
    dot = chart.proto.spec
    nodes = set(re.findall(r'^  "([^"]+)" \[', dot, re.MULTILINE))
    for cause in REFERENCE_CAUSES:
        assert f"cause:{cause}" in nodes
    assert f"incident:{REFERENCE}" in nodes
    assert "decision:1" in nodes
    assert {f"{q}/cause:reasoning-exhausts-budget" for q in QWEN} <= nodes  # family
    assert re.search(
        r'"cause:reasoning-exhausts-budget" \[label="[^"]*", shape="box", '
        r'fillcolor="#c0392b"',
        dot,
    )  # confirmed: red
    rejected = STATUS_COLOURS["rejected"]
    assert re.search(rf'"cause:quantized-weights" \[[^\]]*fillcolor="{rejected}"', dot)  # grey
    assert re.search(r'"decision:1" \[label="PARKED\\n2026-06-10"', dot)
    assert any(code.language == "dot" and code.value.strip() == dot.strip() for code in at.code)
    assert "evidence:E9" not in nodes  # evidence nodes only on request
    at.toggle(key="graph_evidence").set_value(True)
    at.run()
    dot = at.get("graphviz_chart")[0].proto.spec
    assert '"evidence:E9" -> "cause:reasoning-exhausts-budget" [label="supports"' in dot
    assert '"evidence:E6" -> "cause:quantized-weights" [label="refutes"' in dot


def test_incident_page_history_references_and_evidence(kb_url: str) -> None:
    at = open_page("incident", slug=REFERENCE)
    history = table(at, "history_table")
    decision = history[history["What"] == "decision"].iloc[0]
    assert decision["Change"] == "PARKED (revisit 2026-09-10)"
    assert decision["By"] == "operator"
    quantized = history[history["What"] == "cause quantized-weights"]
    assert list(quantized["Change"])[-1].endswith("-> rejected")
    references = " ".join(texts(at, "markdown"))
    assert "[llama.cpp #23335: draft-mtp deterministic output divergence (Qwen)]" in references
    assert "(https://github.com/ggml-org/llama.cpp/issues/23335)" in references
    family_links = {(link.proto.page, link.proto.query_string) for link in at.get("page_link")}
    assert {("incident", f"slug={q}") for q in QWEN} <= family_links
    evidence = table(at, "evidence_table")
    assert "E9" in set(evidence["Id"])


def test_incident_page_probe_arms_table_and_chart(kb_url: str, tmp_path: Path) -> None:
    store = Store(kb_url)
    try:
        import_paths(store, [write_incident(tmp_path, ARMS_INCIDENT)])
    finally:
        store.close()
    at = open_page("incident", slug="2026-07-01-drill-arms")
    arms = table(at, "arms_table")
    assert list(arms["Arm"]) == ["baseline", "thinking-off"]
    assert list(arms["k/n"]) == ["12/16", "0/16"]
    assert arms.iloc[1]["p-value"] == pytest.approx(0.00001)
    assert arms.iloc[0]["95% low"] == pytest.approx(0.505)
    [chart] = at.get("vega_lite_chart")
    assert "errorbar" in chart.proto.spec or '"x2"' in chart.proto.spec


def test_incident_page_unknown_slug_and_picker(kb_url: str) -> None:
    at = open_page("incident", slug="2099-01-01-nothing")
    assert "No incident '2099-01-01-nothing'" in texts(at, "error")[0]
    # Without a slug the page opens the most recent incident, not a blank chooser.
    at = open_page("incident")
    assert md_unescape(at.title[0].value).startswith("Gemma 4 on llama-server")
    assert table(at, "causes_table") is not None
    assert any("most recent" in c.value for c in at.caption)


def test_incident_page_override_and_decision_land_in_history(kb_url: str) -> None:
    at = open_page("incident", slug=REFERENCE)
    at.selectbox(key="override_cause").set_value("quantized-weights")
    at.radio(key="override_status").set_value("suspected")
    at.text_input(key="override_actor").input("alice")
    at.text_area(key="override_rationale").input("The A/B used 4 prompts only; reopen it.")
    at.multiselect(key="override_evidence").set_value(["E6"])
    submit(at, "Change status")
    assert "quantized-weights is now suspected." in texts(at, "success")
    history = table(at, "history_table")
    row = history[history["By"] == "alice"].iloc[0]
    assert (row["What"], row["Change"], row["Evidence"]) == (
        "cause quantized-weights",
        "rejected -> suspected",
        "E6",
    )
    causes = table(at, "causes_table")
    assert causes[causes["Cause"] == "quantized-weights"].iloc[0]["Status"] == "suspected"

    at.radio(key="decision_kind").set_value("PARKED")
    at.text_input(key="decision_by").input("bob")
    at.text_area(key="decision_rationale").input("Still non-core; look again after b9700.")
    # The decision is stamped with the real clock (TRIAGE_TODAY pins only what the pages
    # read), so its revisit date must lie after the real today, whenever the suite runs.
    revisit = date.today() + timedelta(days=60)
    at.date_input(key="decision_revisit").set_value(revisit)
    at.text_area(key="decision_triggers").input("new-build>9700\nfailure-rate>20%,min=5")
    submit(at, "Record decision")
    assert "Recorded PARKED." in texts(at, "success")
    history = table(at, "history_table")
    decisions = history[history["What"] == "decision"]
    assert list(decisions["By"]) == ["operator", "bob"]
    assert list(decisions["Change"])[-1] == f"PARKED (revisit {revisit.isoformat()})"
    info = " ".join(texts(at, "info"))
    assert f"Revisit on {revisit.isoformat()}" in info and "newer than b9700" in info


def test_incident_page_refuses_incomplete_decisions(kb_url: str) -> None:
    at = open_page("incident", slug=REFERENCE)
    submit(at, "Record decision")
    assert texts(at, "error") == ["Not recorded: say who decides; say why"]
    at.radio(key="decision_kind").set_value("FIXED")
    at.text_input(key="decision_by").input("carol")
    at.text_area(key="decision_rationale").input("Turned thinking off on the server.")
    at.text_area(key="decision_fix").input("--reasoning off")
    submit(at, "Record decision")
    [error] = texts(at, "error")
    assert error.startswith(f"Not recorded: {REFERENCE}: refusing FIXED without evidence")
    history = table(at, "history_table")
    assert list(history[history["What"] == "decision"]["Change"]) == ["PARKED (revisit 2026-09-10)"]
    # With "record anyway" the fix is kept, labelled unverified.
    at.checkbox(key="decision_force").check()
    submit(at, "Record decision")
    history = table(at, "history_table")
    assert list(history[history["What"] == "decision"]["Change"])[-1] == "FIXED (unverified)"


def submit(at: AppTest, label: str) -> None:
    [button] = [b for b in at.button if b.label == label]
    button.click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def write_incident(folder: Path, text: str) -> Path:
    slug = re.search(r"^slug: (\S+)$", text, re.MULTILINE)
    assert slug is not None
    path = folder / f"{slug.group(1)}.md"
    path.write_text(text, "utf-8")
    return path


ARMS_INCIDENT = """---
slug: 2026-07-01-drill-arms
title: Drill with probe arms
status: open
opened: 2026-07-01
evidence:
  - id: E1
    kind: probe
    summary: baseline arm
    recorded_at: 2026-07-01
    payload: {type: arm, arm: baseline, variant: as-is, n: 16, failures: 12, rate: 0.75,
              ci95: [0.505, 0.898], p_value: null, decision: baseline}
  - id: E2
    kind: probe
    summary: thinking-off arm
    recorded_at: 2026-07-01
    payload: {type: arm, arm: thinking-off, variant: enable_thinking false, n: 16, failures: 0,
              rate: 0.0, ci95: [0.0, 0.194], p_value: 0.00001, decision: improves}
causes:
  - id: reasoning-exhausts-budget
    catalogue: reasoning-exhausts-budget
    title: Reasoning eats the budget
    status: confirmed
    basis: measured
    deciding_probe: thinking-off
    evidence:
      - {id: E2, relation: supports}
---
Drill.
"""


# --------------------------------------------------------------------------- Decision log


def test_decision_log_in_time_order_with_rationale_tradeoff_and_revisit(kb_url: str) -> None:
    at = open_page("decisions")
    assert [t.value for t in at.title] == ["Decision log"]
    assert "No parked incident is past its revisit date or trigger." in texts(at, "success")
    rows = table(at, "decisions_table")
    assert list(rows["Incident"]) == [REFERENCE]
    row = rows.iloc[0]
    assert row["Decision"] == "PARKED"
    assert row["Overdue"] == ""
    assert row["Revisit state"] == "waiting"
    assert str(row["Revisit on"]) == "2026-09-10"
    assert row["Rationale"].startswith("Gemma is non-core")
    assert "~35% decode speed" in row["Tradeoff"]
    assert "a new llama-server build" in row["Triggers"]
    assert "Select a row to open its incident." in texts(at, "caption")


def test_decision_log_marks_a_parked_incident_past_its_date_overdue_first(
    kb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A later decision on another incident, so "overdue first" differs from time order.
    store = Store(kb_url)
    try:
        import_paths(store, [write_incident(tmp_path, ARMS_INCIDENT)])
        actions.record_decision(
            KnowledgeBase(store),
            "2026-07-01-drill-arms",
            actions.DecisionInput(
                kind="PARKED", by="dana", rationale="Drill only.", revisit_on=date(2099, 1, 1)
            ),
        )
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_TODAY", AFTER_REVISIT)
    at = open_page("decisions")
    [overdue] = texts(at, "error")
    assert overdue.startswith(
        f"**OVERDUE** (overdue) · {REFERENCE} -- revisit date 2026-09-10 passed 10 day(s) ago"
    )
    assert any(s.startswith("Overdue (1)") for s in texts(at, "subheader"))
    rows = table(at, "decisions_table")
    assert list(rows["Incident"]) == [REFERENCE, "2026-07-01-drill-arms"]
    assert list(rows["Overdue"]) == ["OVERDUE", ""]
    # Time order for the rest; newest first on request.
    at.toggle(key="decisions_newest_first").set_value(True)
    at.run()
    assert list(table(at, "decisions_table")["Incident"])[0] == REFERENCE

    # The Incident page carries the same marker.
    at = open_page("incident", slug=REFERENCE)
    assert texts(at, "error")[0].startswith("**OVERDUE** (overdue) -- revisit date 2026-09-10")


# --------------------------------------------------------------------------- New triage

PAIR = """{"request": {"model": "gemma", "max_tokens": 800,
  "messages": [{"role": "user", "content": "write a 120-char paragraph"}]},
 "response": {"choices": [{"index": 0, "finish_reason": "length",
  "message": {"role": "assistant", "content": "", "reasoning_content": "thinking..."}}]}}"""


def configure_stacks(monkeypatch: pytest.MonkeyPatch, *stacks: Path) -> None:
    """The stack files an administrator gave `triage ui --stack` (the form offers only these)."""
    monkeypatch.setenv("TRIAGE_UI_STACKS", os.pathsep.join(str(p) for p in stacks))


def write_stack(tmp_path: Path, text: str, name: str = "stack.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def fill_triage_form(at: AppTest, *, exchange: str, stack: str | None = None) -> None:
    at.text_area(key="triage_exchange_text").input(exchange)
    if stack is not None:
        at.selectbox(key="triage_stack").set_value(stack)


def test_new_triage_validates_the_form(
    kb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure_stacks(
        monkeypatch,
        write_stack(tmp_path, '[server]\nmodel = "m.gguf"\n'),
        write_stack(tmp_path, '[server]\nmodel = "missing.gguf"\n', "missing.toml"),
    )
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    at = open_page("new_triage")
    assert [t.value for t in at.title] == ["New triage"]
    submit(at, "Run triage")
    assert texts(at, "error") == ["paste or upload the failing exchange"]

    fill_triage_form(at, exchange="{not json", stack="stack.toml")
    submit(at, "Run triage")
    assert texts(at, "error")[0].startswith("exchange: ")

    fill_triage_form(at, exchange=PAIR, stack="missing.toml")
    submit(at, "Run triage")
    [error] = texts(at, "error")
    assert error.startswith("stack: ") and "missing.gguf" in error


def test_new_triage_runs_the_engine_with_progress_and_lands_on_the_incident(
    kb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    calls: list[dict[str, Any]] = []

    def fake_run_triage(
        store: Store, exchange: Any, stack: Any, progress: Any, **options: Any
    ) -> Diagnosis:
        calls.append({"exchange": exchange, "stack": stack, **options})
        progress(0.5, "probe thinking-off: 8/16")
        return Diagnosis.from_json({"incident": REFERENCE})

    monkeypatch.setattr(actions, "run_triage", fake_run_triage)
    configure_stacks(monkeypatch, write_stack(tmp_path, '[server]\nmodel = "m.gguf"\n'))
    at = open_page("new_triage")
    fill_triage_form(at, exchange=PAIR)
    submit(at, "Run triage")
    [call] = calls
    assert call["exchange"].response["choices"][0]["finish_reason"] == "length"
    assert call["stack"].server.model == tmp_path / "m.gguf"
    assert call["max_requests"] == 32 and call["incident"] is None
    # Landed on the Incident page of the diagnosis' incident.
    assert md_unescape(at.title[0].value).startswith("Gemma 4 on llama-server")
    assert at.query_params.get("slug") in (REFERENCE, [REFERENCE])


def test_progress_adapter_reports_fractions_from_engine_events() -> None:
    from triage.engine import ProgressEvent

    seen: list[tuple[float, str]] = []
    callback = actions._progress_adapter(lambda f, m: seen.append((f, m)))
    callback(ProgressEvent("plan", "4 arms"))
    callback(ProgressEvent("probe", "baseline 8/16", done=8, total=16))
    callback(ProgressEvent("record", "", done=0, total=0))
    assert seen == [(0.0, "plan: 4 arms"), (0.5, "probe: baseline 8/16"), (0.5, "record")]


# --------------------------------------------------------------------------- Retrospective


def test_retrospective_renders_and_offers_the_markdown(kb_url: str) -> None:
    at = open_page("retrospective", slug=REFERENCE)
    [download] = at.get("download_button")
    assert download.proto.label == "Download Markdown"
    [html] = at.get("html")
    body = html.proto.body
    assert "<h1" in body and "Retrospective" in body
    assert "2797" in body and "PARKED" in body
    assert "<script" not in body
    [source] = [c for c in at.code if c.language == "markdown"]
    assert source.value.lstrip().startswith("# Retrospective: Gemma 4 on llama")
    links = [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
    assert ("incident", f"slug={REFERENCE}") in links
    # The text to paste into Slack: its own markup, no anchors, no backslash escapes.
    at.radio(key="retro_format").set_value("slack").run()
    [slack] = [c for c in at.code if c.language == "markdown"]
    assert slack.value.startswith("*Retrospective: Gemma 4 on llama")
    assert "](#" not in slack.value and "\\" not in slack.value
    assert at.get("download_button")[0].proto.label == "Download for slack"


def test_retrospective_without_a_slug_opens_the_most_recent_incident(kb_url: str) -> None:
    at = open_page("retrospective")
    [html] = at.get("html")
    assert "Gemma 4 on llama" in html.proto.body and "2797" in html.proto.body
    links = [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
    assert ("incident", f"slug={REFERENCE}") in links


def test_pages_without_a_slug_say_so_on_an_empty_knowledge_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        for page in ("incident", "retrospective"):
            at = open_page(page)
            assert any("No incidents" in i for i in texts(at, "info")), page
    finally:
        data.forget_stores()


def test_new_triage_reads_uploaded_files(
    kb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    seen: list[Any] = []
    monkeypatch.setattr(
        actions,
        "run_triage",
        lambda store, exchange, stack, progress, **options: (
            seen.append(exchange) or Diagnosis.from_json({"incident": REFERENCE})
        ),
    )
    configure_stacks(monkeypatch, write_stack(tmp_path, '[server]\nmodel = "m.gguf"\n'))
    at = open_page("new_triage")
    at.file_uploader(key="triage_exchange_file").set_value(
        ("failing.json", PAIR.encode(), "application/json")
    )
    submit(at, "Run triage")
    [exchange] = seen
    assert exchange.response["choices"][0]["message"]["content"] == ""
    assert md_unescape(at.title[0].value).startswith("Gemma 4 on llama-server")


def test_decision_log_marks_a_parked_incident_whose_trigger_fired(
    kb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import datetime, timezone

    from kb.repo.store import add_evidence, require_incident

    store = Store(kb_url)
    try:
        with store.session() as session:
            incident = require_incident(session, REFERENCE)
            add_evidence(
                session,
                incident_id=incident.id,
                kind="observation",
                summary="llama-server upgraded",
                payload={"server_build": "b9999"},
                recorded_at=datetime(2026, 6, 20, tzinfo=timezone.utc),
            )
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_TODAY", BEFORE_REVISIT)  # the revisit date has not come
    at = open_page("decisions")
    [overdue] = texts(at, "error")
    assert overdue.startswith(f"**OVERDUE** (due) · {REFERENCE} -- build b9999 seen in [E")
    assert list(table(at, "decisions_table")["Overdue"]) == ["OVERDUE"]
