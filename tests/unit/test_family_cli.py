"""`triage family` on a capture with a stack file: the replies say what actually answered
(they win over stack.toml), the stack file fills in what they do not, its server
arguments shape the signature but are not printed, and the incident's own stack is left
alone when an incident is the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from triage.cli import cli

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "real"
INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"


@pytest.fixture()
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    assert CliRunner().invoke(cli, ["--database", url, "import", str(INCIDENTS)]).exit_code == 0
    return url


def _stack(folder: Path, *args: str) -> Path:
    (folder / "qwen3-8b.gguf").write_bytes(b"GGUF")
    stack = folder / "stack.toml"
    stack.write_text(f'[server]\nmodel = "qwen3-8b.gguf"\nargs = {json.dumps(list(args))}\n')
    return stack


def _family(database: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--database", database, "family", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_capture_with_a_stack_file(database: str, tmp_path: Path) -> None:
    stack = _stack(tmp_path, "-c", "4096", "--reasoning", "off")
    data = _family(database, str(CAPTURES / "budget-greedy.response.json"), "--stack", str(stack))
    # The reply names the model, build and draft use: they win over stack.toml's model.
    assert data["stack"] == {
        "model": "/tmp/capgen/drills2/b/gemma4-thinking-budget-qat.gguf",
        "server_build": "b11434-sdist",
        "speculative": True,
        "thinking_default": True,
    }
    signature = data["signature"]
    assert (signature["model_family"], signature["server_build"]) == ("gemma", "11434")
    assert (signature["spec"], signature["thinking"]) == ("on", "on")
    assert data["links_made"] == []


def test_an_incident_widened_by_a_stack_file_and_extra_kinds(database: str, tmp_path: Path) -> None:
    plain = _family(database, REFERENCE)
    assert plain == {**plain, "target": REFERENCE, "incident": REFERENCE}
    stack = _stack(tmp_path, "-c", "4096", "--reasoning", "off")
    wider = _family(database, REFERENCE, "--stack", str(stack), "--kinds", "timeout")
    before, after = plain["signature"], wider["signature"]
    assert after["kinds"] == sorted({*before["kinds"], "timeout"})
    # The stack file's known fields replace the incident's; the others stay.
    assert after["model_family"] == "qwen" and before["model_family"] == "gemma"
    assert after["thinking"] == "off" and after["spec"] == "off"
    assert after["server_build"] == before["server_build"]
    assert REFERENCE not in [match["slug"] for match in wider["matches"]]
