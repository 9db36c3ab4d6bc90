"""The atlas where incidents are read: an incident the proxy opens carries its matches as
references (what the UI incident page, the export and the retro show); the UI's incident
page lists the matches of an incident's captured exchange."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from proxy_fakes import raw_record
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from kb.models import Incident, Reference
from kb.repo.store import Store
from triage.cli import cli
from triage.proxy import Recorder
from triage.ui import data
from triage.ui.text import md_unescape

ENTRIES = Path(__file__).resolve().parents[1] / "fixtures" / "atlas" / "entries"
APP = str(Path(__file__).resolve().parents[2] / "triage" / "ui" / "app.py")
JINJA_ERROR = {"error": {"code": 500, "message": "tools param requires --jinja flag"}}


@pytest.fixture(autouse=True)
def fixture_atlas(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "shipped"
    empty.mkdir()
    monkeypatch.setattr("kb.atlas.loader.SHIPPED_DIR", empty)
    monkeypatch.setenv("TRIAGE_ATLAS_PATH", str(ENTRIES))


def _error_record(key: str, at: float) -> dict[str, object]:
    record = raw_record(key, "", at=at)
    record["status"] = 500
    record["response_chunks"] = [json.dumps(JINJA_ERROR).encode()]
    return record


def _references(db_file: str) -> tuple[list[Incident], list[Reference]]:
    store = Store(db_file, migrate=False)
    try:
        with store.session(readonly=True) as session:
            return list(session.exec(select(Incident)).all()), list(
                session.exec(select(Reference)).all()
            )
    finally:
        store.close()


def test_an_incident_the_proxy_opens_carries_its_atlas_matches(tmp_path: Path) -> None:
    db_file = f"sqlite:///{tmp_path / 'kb.db'}"
    recorder = Recorder(db_file, spool_path=tmp_path / "spool.jsonl", replica="r")
    recorder.start()
    try:
        now = time.time()
        for i in range(10):  # the minimum comparison window: 10 exchanges
            recorder.submit(_error_record(f"a{i}", now - 30 + i))
        recorder.flush(10)
        (opened,) = recorder.opened
    finally:
        recorder.stop()
    incidents, references = _references(db_file)
    assert [i.slug for i in incidents] == [opened["slug"]]
    (reference,) = references
    assert reference.url == "https://github.com/containers/ramalama/issues/988"
    assert reference.title.startswith("atlas ramalama-988: ")
    assert "a pointer, not a verdict" in reference.note
    assert "'tools param requires --jinja flag' found" in reference.note


def test_an_incident_without_a_signature_gets_no_reference(tmp_path: Path) -> None:
    db_file = f"sqlite:///{tmp_path / 'kb.db'}"
    recorder = Recorder(db_file, spool_path=tmp_path / "spool.jsonl", replica="r")
    recorder.start()
    try:
        now = time.time()
        for i in range(10):  # the minimum comparison window: 10 exchanges
            recorder.submit(raw_record(f"a{i}", "", at=now - 30 + i))  # empty content only
        recorder.flush(10)
        assert len(recorder.opened) == 1
    finally:
        recorder.stop()
    assert _references(db_file)[1] == []


def test_the_ui_incident_page_lists_the_matches_of_a_captured_exchange(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    runner = CliRunner()
    opened = runner.invoke(cli, ["incidents", "new", "Tools refused"])
    assert opened.exit_code == 0, opened.stderr
    slug = opened.stdout.split()[-1]
    capture = ENTRIES.parent / "cases" / "jinja-capture" / "capture.json"
    stored = runner.invoke(cli, ["capture", str(capture), "--incident", slug])
    assert stored.exit_code == 0, stored.stderr
    try:
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page("views/incident.py")
        at.query_params.update({"slug": slug})
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert "Known public incidents (atlas)" in [s.value for s in at.subheader]
        shown = " ".join(md_unescape(str(m.value)) for m in at.markdown)
        assert "(https://github.com/containers/ramalama/issues/988)" in shown
        assert "'tools param requires --jinja flag' found" in shown
    finally:
        data.forget_stores()
