"""New triage and the parked views wired to the catalogue: registered capture formats, a
run that did not reproduce (or ended partial) says so, pasted `-d @PATH` reads nothing from
the host, plugin trigger kinds are described, and a catalogue that disagrees with the
database's numbering stops the UI with a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from plugin_dist import installed
from test_trigger_plugins import PLUGIN
from test_ui_pages import (
    PAIR,
    REFERENCE,
    configure_stacks,
    fill_triage_form,
    kb_url,  # noqa: F401 -- fixture
    open_page,
    submit,
    texts,
    write_stack,
)

from kb import vocab
from kb.domain.diagnosis import Diagnosis
from kb.repo.store import Store
from triage.capture import format_ids
from triage.cli import cli
from triage.ui import actions
from triage.ui.text import md_unescape


def _fake_run(monkeypatch: pytest.MonkeyPatch, diagnosis: dict[str, Any]) -> list[Any]:
    calls: list[Any] = []

    def fake(store: Store, exchange: Any, stack: Any, progress: Any, **options: Any) -> Any:
        calls.append(exchange)
        return Diagnosis.from_json(diagnosis)

    monkeypatch.setattr(actions, "run_triage", fake)
    return calls


def _page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    configure_stacks(monkeypatch, write_stack(tmp_path, '[server]\nmodel = "m.gguf"\n'))
    return open_page("new_triage")


def test_the_format_choice_comes_from_the_registry(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at = _page(tmp_path, monkeypatch)
    offered = list(at.selectbox(key="triage_format").options)
    assert offered[0] == "auto" and sorted(offered[1:]) == sorted(format_ids())


def test_a_run_that_did_not_reproduce_says_so_and_links_the_incident(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = "0/8 replays showed the captured failure (length-stop)"
    _fake_run(
        monkeypatch,
        {
            "incident": REFERENCE,
            "state": "not-reproduced",
            "reproduction": {"reproduced": False, "message": message},
        },
    )
    at = _page(tmp_path, monkeypatch)
    fill_triage_form(at, exchange=PAIR)
    submit(at, "Run triage")
    [warning] = [md_unescape(w) for w in texts(at, "warning")]
    assert warning.startswith("Not reproduced: ") and message in warning
    assert "No cause was moved" in warning
    assert [t.value for t in at.title] == ["New triage"]  # stayed, did not jump away
    links = [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
    assert ("incident", f"slug={REFERENCE}") in links


def test_a_partial_run_is_flagged(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_run(
        monkeypatch,
        {
            "incident": REFERENCE,
            "state": "partial",
            # as the engine reports an arm that errored
            "undecided": ["arm spec-off errored: server died (exit code -11)"],
        },
    )
    at = _page(tmp_path, monkeypatch)
    fill_triage_form(at, exchange=PAIR)
    submit(at, "Run triage")
    [warning] = [md_unescape(w) for w in texts(at, "warning")]
    assert "partial" in warning and "server died (exit code -11)" in warning


def test_a_pasted_curl_cannot_read_a_file_beside_the_stack(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake_run(monkeypatch, {"incident": REFERENCE, "state": "done"})
    (tmp_path / "body.json").write_text('{"messages": [{"role": "user", "content": "x"}]}')
    at = _page(tmp_path, monkeypatch)
    fill_triage_form(
        at,
        exchange="curl http://127.0.0.1:8080/v1/chat/completions "
        "-H 'Content-Type: application/json' -d @body.json",
    )
    submit(at, "Run triage")
    [error] = texts(at, "error")
    assert error.startswith("exchange: ") and "give the capture as a file" in md_unescape(error)
    assert calls == []


def test_a_plugin_trigger_kind_is_described_on_the_incident_page(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    with installed(tmp_path, "mentions_trigger", PLUGIN):
        parked = CliRunner().invoke(
            cli,
            [
                "--database",
                kb_url,
                "decide",
                REFERENCE,
                "--parked",
                "--why",
                "waiting",
                "--when",
                "mentions=flash-attn",
            ],
        )
        assert parked.exit_code == 0, parked.output
        at = open_page("incident", slug=REFERENCE)
        shown = " ".join(
            texts(at, "markdown")
            + texts(at, "caption")
            + texts(at, "warning")
            + texts(at, "info")
            + texts(at, "success")
        )
        assert "evidence that mentions 'flash-attn'" in shown
        assert "unknown trigger kind" not in shown


def test_a_catalogue_the_database_disagrees_with_stops_the_ui(
    kb_url: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    store = Store(kb_url)
    try:
        with store.session() as session:  # a database whose cause number 1 means another id
            vocab.record_numbers(session, "cause", {"someone-elses-cause": 1})
    finally:
        store.close()
    from streamlit.testing.v1 import AppTest
    from test_ui_pages import APP

    at = AppTest.from_file(APP, default_timeout=60).run()
    errors = [md_unescape(e) for e in texts(at, "error")]
    assert any("catalogue cannot use this knowledge base" in e for e in errors), (
        errors,
        [e.value for e in at.exception],
    )
