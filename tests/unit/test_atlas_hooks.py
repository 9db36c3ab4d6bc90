"""The atlas where incidents are read: an incident the proxy opens carries its matches as
references (what the UI incident page, the export and the retro show)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from proxy_fakes import raw_record
from sqlmodel import select

from kb.models import Incident, Reference
from kb.store import Store
from triage.proxy import Recorder

ENTRIES = Path(__file__).resolve().parents[1] / "fixtures" / "atlas" / "entries"
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
