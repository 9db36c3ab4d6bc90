"""`triage ui`: the Streamlit command line and the database URL handed to the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kb.repo.engine import make_engine
from kb.repo.migrate import current_revision
from triage.cli import cli
from triage.commands import ui


def test_streamlit_argv_is_headless_on_loopback() -> None:
    argv = ui.streamlit_argv(8765, "127.0.0.1")
    assert argv[1:5] == ["-m", "streamlit", "run", str(ui.APP)]
    assert ui.APP.is_file()
    for option in (
        "--server.headless=true",
        "--server.port=8765",
        "--server.address=127.0.0.1",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
    ):
        assert option in argv


def test_triage_ui_passes_the_database_url_and_migrates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_execve(path: str, argv: list[str], env: dict[str, Any]) -> None:
        calls.append((path, argv, env))

    monkeypatch.setattr(ui.os, "execve", fake_execve)
    url = f"sqlite:///{tmp_path / 'team.db'}"
    result = CliRunner().invoke(
        cli, ["--database", url, "ui", "--port", "9123", "--host", "127.0.0.1"]
    )
    assert result.exit_code == 0, result.output
    [(path, argv, env)] = calls
    assert argv[0] == path
    assert "--server.port=9123" in argv
    assert env["TRIAGE_DATABASE_URL"] == url
    engine = make_engine(url)
    try:
        assert current_revision(engine) is not None  # migrated before the server starts
    finally:
        engine.dispose()


def test_triage_ui_reports_a_bad_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui.os, "execve", lambda *a: pytest.fail("must not start"))
    result = CliRunner().invoke(
        cli, ["--database", "postgresql+psycopg://u:secret@127.0.0.1:1/x", "ui"]
    )
    assert result.exit_code != 0
    assert "secret" not in result.output
    assert "u:***@127.0.0.1:1/x" in result.output
