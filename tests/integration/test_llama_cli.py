"""`triage server build|which` and `triage drill` against the real build and server."""

from __future__ import annotations

import json
import re
import time

import pytest
from click.testing import CliRunner

from triage.cli import cli
from triage.llama.build import BUILD_NUMBER, binary_build_info, build_server, installed_binary

pytestmark = pytest.mark.integration


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_server_which(server_binary):
    result = invoke("server", "which")
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == str(server_binary)
    assert f"build {BUILD_NUMBER} (commit sdist)" in result.output
    data = json.loads(invoke("server", "which", "--json").output)
    assert data["build_number"] == BUILD_NUMBER and data["binary"] == str(server_binary)


def test_build_is_cached(server_binary, monkeypatch):
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    started = time.monotonic()
    path = build_server(log=lambda line: None)
    assert time.monotonic() - started < 10  # stamped: nothing is fetched or compiled
    assert path == installed_binary()
    assert binary_build_info(path)["build_number"] == BUILD_NUMBER
    result = invoke("server", "build")
    assert result.exit_code == 0 and result.output.strip() == str(path)


def test_drill_command_json(server_binary):
    result = invoke("drill", "gemma4-toolcall", "--json", "--repeat", "3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["server"]["build"] == BUILD_NUMBER
    names = [summary["name"] for summary in report["results"]]
    assert names == ["sampled#1", "sampled#2", "sampled#3", "greedy", "sampled-thinking-off"]
    greedy = report["results"][3]
    assert greedy["finish_reason"] == "tool_calls"
    assert greedy["tool_calls"][0]["name"] == "get_weather"
    assert greedy["timings"]["draft_n"] > 0


def test_drill_command_text(server_binary, tmp_path):
    out = tmp_path / "drill"
    result = invoke("drill", "gemma4-thinking-budget", "--out", str(out))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    reasoning = manifest["requests"][0]["expect"]["reasoning_chars"]
    greedy = next(line for line in result.output.splitlines() if line.startswith("greedy "))
    assert "finish=length" in greedy and "content=0ch" in greedy
    assert f"reasoning={reasoning}ch" in greedy
    assert re.search(r"draft \d+/\d+ \(\d+%\)", greedy)
    off = next(line for line in result.output.splitlines() if line.startswith("greedy-thinking"))
    assert "finish=stop" in off and "content=687ch" in off
    assert (out / "stack.toml").is_file() and list((out / "logs").glob("*.log"))


def test_unknown_drill_name():
    result = CliRunner().invoke(cli, ["drill", "no-such-drill"])
    assert result.exit_code == 2
    known = result.output.split("known: ", 1)[1]  # the shared drills among the others
    assert "gemma4-thinking-budget" in known and "gemma4-toolcall" in known
