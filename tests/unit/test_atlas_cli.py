"""`triage atlas list/show/match/import`, and the matches printed by `triage check` and
carried by a diagnosis (CliRunner; the atlas is the fixture folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kb.atlas import load_atlas, match_atlas, team_dir
from kb.domain.diagnosis import Diagnosis, validate_diagnosis
from triage.atlas.facts import facts_from_log
from triage.atlas.report import diagnosis_matches, format_match_dicts
from triage.capture import load_file
from triage.cli import cli
from triage.commands.capture import Classified
from triage.commands.engine import _print_atlas_before, format_diagnosis
from triage.engine import Intake
from triage.stackfile import ServerConfig, Stack
from triage.symptoms import classify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "atlas"
ENTRIES = FIXTURES / "entries"
CASES = FIXTURES / "cases"


@pytest.fixture(autouse=True)
def only_fixture_entries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The shipped folder is replaced by an empty one: the tests read the fixture atlas."""
    empty = tmp_path / "shipped"
    empty.mkdir()
    monkeypatch.setattr("kb.atlas.loader.SHIPPED_DIR", empty)
    monkeypatch.setenv("TRIAGE_ATLAS_PATH", str(ENTRIES))


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_list_and_show() -> None:
    code, out, _ = run("atlas", "list", "--json")
    assert code == 0
    listed = {e["id"]: e for e in json.loads(out)}
    assert set(listed) == {p.stem for p in ENTRIES.glob("*.md")}
    assert listed["llama.cpp-20824"]["builds"]["fixed_in"] == 11500
    code, out, _ = run("atlas", "show", "ramalama-988")
    assert code == 0 and "tools param requires --jinja flag" in out
    assert "https://github.com/containers/ramalama/issues/988" in out
    code, out, _ = run("atlas", "show", "llama.cpp-20824", "--json")
    assert json.loads(out)["workaround"] == "Start llama-server with --no-repack"


def test_show_an_unknown_id_is_one_error_line() -> None:
    code, _, err = run("atlas", "show", "20824")
    assert code == 1
    assert err.strip() == "Error: no atlas entry '20824' (did you mean llama.cpp-20824?)"


def test_match_a_log_and_a_capture() -> None:
    code, out, _ = run("atlas", "match", "--log", str(CASES / "amx-crash-log" / "server.log"))
    assert code == 0
    assert "llama.cpp-20824" in out and "-> workaround: Start llama-server with --no-repack" in out
    code, out, _ = run("atlas", "match", str(CASES / "jinja-capture" / "capture.json"), "--json")
    assert code == 0
    (result,) = json.loads(out)["results"]
    assert [m["id"] for m in result["matches"]] == ["ramalama-988"]
    assert result["facts"]["http_status"] == [500]
    code, out, _ = run("atlas", "match", str(CASES / "unrelated-500" / "capture.json"))
    assert code == 0 and "no match among 4 entries" in out


def test_match_build_option_says_past_the_fix() -> None:
    log = str(CASES / "amx-crash-log" / "server.log")
    # the log says 11434; a stated --build comes first
    code, out, _ = run("atlas", "match", "--log", log, "--build", "11600", "--json")
    (match,) = json.loads(out)["results"][0]["matches"]
    assert match["past_fix"] is True and match["advice"][0].startswith("you are past the fix")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["atlas", "match", "--log", "missing.log"], "missing.log: cannot read the log"),
        (
            ["atlas", "match", str(CASES / "amx-crash-log" / "server.log")],
            "server.log:1: invalid JSON",
        ),
        (["atlas", "--atlas", "nowhere", "list"], "Error: nowhere: $: not a folder"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], message: str) -> None:
    code, _, err = run(*args)
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_match_without_input_is_a_usage_error() -> None:
    code, _, err = run("atlas", "match")
    assert code == 2 and "give a capture FILE or --log SERVER_LOG" in err


def test_import_copies_checked_entries_into_the_team_folder(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    text = (ENTRIES / "ramalama-988.md").read_text(encoding="utf-8")
    (ours / "team-1.md").write_text(text.replace("id: ramalama-988", "id: team-1"), "utf-8")
    code, out, _ = run("atlas", "import", str(ours))
    assert code == 0 and "added: team-1" in out
    assert (team_dir() / "team-1.md").is_file()
    code, out, _ = run("atlas", "list", "--json")
    assert "team-1" in {e["id"] for e in json.loads(out)}
    (ours / "team-2.md").write_text("---\nid: team-2\ntitle: x\n---\n", "utf-8")
    code, _, err = run("atlas", "import", str(ours))
    assert code == 1 and "team-2.md: $: 'project' is a required property" in err
    assert not (team_dir() / "team-2.md").exists()


def test_a_bad_team_file_is_named_by_every_atlas_command(tmp_path: Path) -> None:
    team_dir().mkdir(parents=True)
    (team_dir() / "broken.md").write_text("---\nid: [\n---\n", "utf-8")
    code, _, err = run("atlas", "list")
    assert code == 1 and "broken.md: $: invalid YAML front matter" in err


def test_check_prints_the_matches_and_carries_them_in_json() -> None:
    capture = str(CASES / "jinja-capture" / "capture.json")
    code, out, _ = run("check", capture)
    assert code == 0
    assert "Known public incidents (atlas -- a pointer, not a verdict):" in out
    assert "ramalama-988" in out
    code, out, _ = run("check", capture, "--json")
    (item,) = json.loads(out)
    assert "http-error" in item["symptoms"]
    assert set(item) - {"atlas_matches"} == set(Classified(*_one(capture)).to_dict())
    assert [m["id"] for m in item["atlas_matches"]] == ["ramalama-988"]


def test_check_of_a_bad_team_atlas_warns_and_still_checks() -> None:
    team_dir().mkdir(parents=True)
    (team_dir() / "broken.md").write_text("no front matter", "utf-8")
    code, out, err = run("check", str(CASES / "jinja-capture" / "capture.json"))
    assert code == 0 and "FAIL: http-error" in out
    assert "warning: atlas not read:" in err and "broken.md" in err


def _stack(binary: Path) -> Stack:
    return Stack(server=ServerConfig(binary=binary, args=("-c", "8192")))


def test_diagnosis_matches_use_the_stack_build_and_the_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "avx2 amx_int8 amx_tile")  # an AMX host
    exchange: dict[str, object] = {}
    stack = _stack(tmp_path / "b11700" / "bin" / "llama-server")  # build from the cache layout
    crash = {
        "causes": [{"id": "cpu-backend", "status": "confirmed"}],
        "arms": [{"name": "baseline", "log_tail": ["#0 0x1 in ggml_backend_amx_mul_mat (x)"]}],
        "observations": [],
    }
    findings = [{"kind": "server-crash", "passed": False}]
    before, checked, warning = diagnosis_matches(stack, exchange, findings)
    assert (before, checked, warning) == ([], 4, None)  # the capture alone says too little
    after, _, _ = diagnosis_matches(stack, exchange, findings, crash)
    (match,) = after
    assert match.entry.id == "llama.cpp-20824" and match.past_fix  # b11700 >= fixed b11500
    assert "cause cpu-backend confirmed by the diagnosis" in [f.detail for f in match.facts]
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "avx2")  # the same on a host without AMX
    assert diagnosis_matches(stack, exchange, findings, crash)[0] == []


def test_the_diagnosis_carries_matches_as_an_extra_field_the_schema_allows() -> None:
    diagnosis = {
        "schema_version": 1,
        "incident": "x",
        "findings": [],
        "arms": [],
        "causes": [],
        "graph": {"nodes": 0, "edges": 0},
    }
    validate_diagnosis(diagnosis)  # optional
    log = (CASES / "amx-crash-log" / "server.log").read_text(encoding="utf-8")
    matches = match_atlas(facts_from_log(log), load_atlas([ENTRIES]))
    diagnosis["atlas_matches"] = [m.to_dict() for m in matches]
    validate_diagnosis(diagnosis)
    text = format_diagnosis(Diagnosis.from_json(diagnosis), matches)
    assert "Known public incidents (atlas -- a pointer, not a verdict):" in text
    assert "llama.cpp-20824" in text and format_match_dicts([]) == []
    diagnosis["atlas_matches"][0]["source"] = "javascript:alert(1)"
    with pytest.raises(ValueError, match="atlas_matches"):
        validate_diagnosis(diagnosis)


def test_diagnose_prints_the_matches_before_probing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exchange = load_file(CASES / "jinja-capture" / "capture.json")[0]
    _print_atlas_before(_stack(tmp_path / "llama-server"), Intake.of(exchange))
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        "before probing:",
        "Known public incidents (atlas -- a pointer, not a verdict):",
    ]
    assert "ramalama-988" in err[2]


def _one(path: str) -> tuple[Any, list[Any]]:
    exchange = load_file(path)[0]
    return exchange, classify(exchange)
