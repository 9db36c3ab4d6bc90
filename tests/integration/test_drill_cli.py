"""Issue 17: `triage drill` names its drills in --help, keeps and announces its folder, and
saves each failing request/response pair so the `triage diagnose` command it prints works
exactly as printed (on the real llama-server)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from triage.cli import cli
from triage.drills import list_drills

pytestmark = pytest.mark.integration


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_help_lists_every_drill() -> None:
    result = invoke("drill", "--help")
    assert result.exit_code == 0
    drills = result.output.split("Drills:", 1)[1]
    for name in list_drills():
        assert name in drills


def test_drill_saves_a_failing_pair_that_diagnoses_as_printed(
    server_binary: Path, tmp_path: Path
) -> None:
    out = tmp_path / "drill"
    result = invoke("drill", "gemma4-thinking-budget", "--out", str(out))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"drill files: {out.resolve()}"
    # The greedy request fails deterministically (its reasoning eats max_tokens).
    failed = lines.index(next(line for line in lines if line.startswith("greedy failed (")))
    assert "length-stop" in lines[failed]
    printed = lines[failed + 1].strip()
    argv = shlex.split(printed)
    assert argv[:2] == ["triage", "diagnose"]
    request = Path(argv[argv.index("--request") + 1])
    response = Path(argv[argv.index("--response") + 1])
    assert request.parent == response.parent == out.resolve()
    body = json.loads(request.read_text("utf-8"))
    assert body["max_tokens"] == 800 and body["messages"]
    reply = json.loads(response.read_bytes())
    assert reply["choices"][0]["finish_reason"] == "length"
    assert (out / "stack.toml").is_file() and (out / "manifest.json").is_file()

    diagnosed = invoke(*argv[1:])  # exactly as printed
    assert diagnosed.exit_code == 0, diagnosed.output
    confirmed = diagnosed.output.split("CONFIRMED:", 1)[1].split("\n\n", 1)[0]
    assert "reasoning-exhausts-budget:" in confirmed


def test_default_folder_is_kept_in_the_data_dir_and_named_in_json(server_binary: Path) -> None:
    result = invoke("drill", "gemma4-thinking-budget", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    folder = Path(report["out_dir"])
    assert folder.name == "gemma4-thinking-budget" and folder.parent.name == "drills"
    assert (folder / "stack.toml").is_file()
    (greedy,) = [pair for pair in report["failing"] if pair["name"] == "greedy"]
    assert Path(greedy["response"]).is_file() and Path(greedy["request"]).is_file()
    assert greedy["diagnose"].startswith("triage diagnose --request ")
