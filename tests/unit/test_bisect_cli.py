"""`triage bisect` end to end with a stand-in oracle (no llama-server): the report, the
incident it opens, one evidence row per tested build plus the result, and a rerun that
resumes on the same incident without measuring again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kb.service import KnowledgeBase
from triage.cli import cli

FIRST_BAD = 9300
VERSIONS = [9100, 9200, 9300, 9400, 9500]


class StepOracle:
    """Every reply of a build from FIRST_BAD on fails, none before; counts what it asked."""

    asked: list[int] = []

    def __init__(self, stack: Any, request: Any, **options: Any) -> None:
        self.request = request

    def replay(self, build: int, start: int, count: int) -> list[bool]:
        StepOracle.asked.append(build)
        return [build >= FIRST_BAD] * count

    def release(self, build: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("triage.commands.bisect.ServerOracle", StepOracle)
    StepOracle.asked = []
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    stack = tmp_path / "stack.toml"
    stack.write_text('[server]\nmodel = "model.gguf"\nargs = ["-c", "2048"]\n')
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    return [
        "--database",
        f"sqlite:///{tmp_path / 'kb.db'}",
        "bisect",
        "--good",
        "b9100",
        "--bad",
        "b9500",
        "--versions",
        ",".join(str(v) for v in VERSIONS),
        "--request",
        str(request),
        "--stack",
        str(stack),
        "--reference-n",
        "8",
    ]


def _run(argv: list[str]) -> Result:
    return CliRunner().invoke(cli, argv, catch_exceptions=False)


def _evidence(database: str, slug: str) -> list[tuple[str, str]]:
    with KnowledgeBase.open(database) as kb:
        record = kb.require_record(slug)
    return sorted((row["kind"], row["payload"]["type"]) for row in record["evidence"])


def test_bisect_records_each_tested_build_and_resumes(setup: list[str]) -> None:
    first = _run([*setup, "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["first_bad"] == FIRST_BAD and report["last_good"] == 9200
    slug = report["incident"]
    tested = len(report["tested"])
    assert tested >= 3  # at least both neighbours and the bad end
    assert (
        _evidence(setup[1], slug)
        == [("observation", "bisect-result")] + [("probe", "bisect-build")] * tested
    )
    asked = len(StepOracle.asked)

    again = _run(setup)  # the text report, resumed from the saved state
    assert again.exit_code == 0, again.output
    assert f"evidence recorded on incident {slug}" in again.stdout
    assert f"first bad: b{FIRST_BAD}" in again.stdout
    assert len(StepOracle.asked) == asked  # nothing measured again


def test_bisect_on_an_unknown_incident_is_one_clear_error(setup: list[str]) -> None:
    result = CliRunner().invoke(cli, [*setup, "--incident", "2026-01-01-nothing-here"])
    assert result.exit_code == 1
    assert "2026-01-01-nothing-here" in result.output
    assert "Traceback" not in result.output
    assert StepOracle.asked == []
