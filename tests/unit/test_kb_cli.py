"""`triage import | export | incidents list | incidents show` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func
from sqlmodel import SQLModel, select

from kb.repo.store import Store
from triage.cli import cli

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
GEMMA = "2026-06-10-gemma4-empty-response"


def _run(store: Store, tmp_path: Path, *args: str) -> Result:
    env = {"TRIAGE_DATABASE_URL": store.url, "TRIAGE_HOME": str(tmp_path / "home")}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def _counts(store: Store) -> dict[str, int]:
    with store.session(readonly=True) as session:
        return {
            table.name: session.exec(select(func.count()).select_from(table)).one()
            for table in SQLModel.metadata.sorted_tables
        }


def test_import_then_show_json_prints_the_causes_and_the_parked_decision(
    store: Store, tmp_path: Path
) -> None:
    imported = _run(store, tmp_path, "import", str(INCIDENTS))
    assert imported.exit_code == 0, imported.output
    assert GEMMA in imported.stdout

    shown = _run(store, tmp_path, "incidents", "show", GEMMA, "--json")
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.stdout)
    statuses = {cause["id"]: cause["status"] for cause in record["causes"]}
    assert statuses == {
        "quantized-weights": "rejected",
        "reasoning-exhausts-budget": "confirmed",
        "qat-flipped-thinking-default": "suspected",
        "speculative-decoding": "suspected",
        "server-build": "suspected",
        "output-parsing": "suspected",
    }
    sub = next(c for c in record["causes"] if c["id"] == "qat-flipped-thinking-default")
    assert (sub["catalogue"], sub["basis"]) == ("reasoning-exhausts-budget", "inferred")
    (decision,) = record["decisions"]
    assert decision["kind"] == "PARKED"
    assert decision["at"] == "2026-06-10"
    assert decision["verified"] is False
    assert decision["revisit_on"] == "2026-09-10"
    assert record["body"].lstrip().startswith("# ")


def test_show_text_lists_causes_and_decision(store: Store, tmp_path: Path) -> None:
    _run(store, tmp_path, "import", str(INCIDENTS))
    shown = _run(store, tmp_path, "incidents", "show", GEMMA)
    assert shown.exit_code == 0, shown.output
    assert "rejected  quantized-weights" in shown.stdout
    assert "confirmed reasoning-exhausts-budget" in shown.stdout
    assert "decision PARKED at 2026-06-10, revisit on 2026-09-10" in shown.stdout
    assert "fix (not verified)" in shown.stdout


def test_list_with_filters_and_json(store: Store, tmp_path: Path) -> None:
    _run(store, tmp_path, "import", str(INCIDENTS))
    listed = _run(store, tmp_path, "incidents", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [row["slug"] for row in rows] == sorted(p.stem for p in INCIDENTS.glob("*.md"))
    parked = json.loads(
        _run(store, tmp_path, "incidents", "list", "--status", "parked", "--json").stdout
    )
    assert [row["slug"] for row in parked] == [GEMMA]
    assert parked[0]["decision"] == "PARKED"
    text = _run(store, tmp_path, "incidents", "list", "--cause", "reasoning-exhausts-budget")
    assert text.stdout.count("\n") == 3
    bad_status = _run(store, tmp_path, "incidents", "list", "--status", "solved")
    assert bad_status.exit_code != 0


def test_export_reproduces_the_committed_files(store: Store, tmp_path: Path) -> None:
    _run(store, tmp_path, "import", str(INCIDENTS))
    out = tmp_path / "out"
    exported = _run(store, tmp_path, "export", "--out", str(out))
    assert exported.exit_code == 0, exported.output
    committed = sorted(INCIDENTS.glob("*.md"))
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in committed]
    for path in committed:
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    one = _run(store, tmp_path, "export", GEMMA, "--out", str(tmp_path / "one"))
    assert one.exit_code == 0, one.output
    assert [p.name for p in (tmp_path / "one").iterdir()] == [f"{GEMMA}.md"]


def test_export_defaults_to_incidents_in_the_working_directory(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(store, tmp_path, "import", str(INCIDENTS))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    exported = _run(store, tmp_path, "export")
    assert exported.exit_code == 0, exported.output
    assert (work / "incidents" / f"{GEMMA}.md").read_bytes() == (
        INCIDENTS / f"{GEMMA}.md"
    ).read_bytes()


def _bad_copy(tmp_path: Path, old: str, new: str) -> Path:
    """The incidents directory with one edit to the Gemma file."""
    directory = tmp_path / "bad"
    directory.mkdir(parents=True)
    for path in INCIDENTS.glob("*.md"):
        text = path.read_text(encoding="utf-8")
        if path.stem == GEMMA:
            assert old in text
            text = text.replace(old, new, 1)
        (directory / path.name).write_text(text, encoding="utf-8")
    return directory


BAD_EDITS = [
    ("status: parked\n", "status: solved\n", "$.status"),
    ("    status: rejected\n", "    status: refuted\n", "$.causes[0].status"),
    (
        "  - id: quantized-weights\n    catalogue: quantized-weights\n",
        "  - id: quantisation\n",
        "$.causes[0].id",
    ),
    (
        "      - id: E6\n        relation: refutes\n",
        "      - id: E99\n        relation: refutes\n",
        "$.causes[0].evidence[0].id",
    ),
    ("opened: 2026-06-10\n", "opened: 2026-06-31\n", "$.opened"),
    ("opened: 2026-06-10\n", "opened: 2026-06-11\n", "$.slug"),
    ("title: ", "title: [unclosed\n", "$"),
]


def test_bad_files_give_a_message_naming_file_and_field_and_change_nothing(
    store: Store, tmp_path: Path
) -> None:
    for index, (old, new, json_path) in enumerate(BAD_EDITS):
        case = tmp_path / f"case{index}"
        directory = _bad_copy(case, old, new)
        before = _counts(store)
        result = _run(store, case, "import", str(directory))
        assert result.exit_code != 0, (old, result.output)
        bad_file = directory / f"{GEMMA}.md"
        assert f"{bad_file}: {json_path}: " in result.stderr, result.stderr
        assert "Traceback" not in result.output + result.stderr
        assert result.stdout == ""
        assert _counts(store) == before


def test_reimporting_the_same_files_skips_them_and_changes_nothing(
    store: Store, tmp_path: Path
) -> None:
    assert _run(store, tmp_path, "import", str(INCIDENTS)).exit_code == 0
    before = _counts(store)
    again = _run(store, tmp_path, "import", str(INCIDENTS))
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("imported 0 incident(s)")
    assert "3 incident(s) already stored from the same file(s)" in again.stdout
    assert _counts(store) == before


def test_an_incident_stored_from_another_file_is_refused_and_changes_nothing(
    store: Store, tmp_path: Path
) -> None:
    assert _run(store, tmp_path, "import", str(INCIDENTS)).exit_code == 0
    before = _counts(store)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in INCIDENTS.glob("*.md"):
        (copy / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    again = _run(store, tmp_path, "import", str(copy))
    assert again.exit_code != 0
    assert "$.slug: an incident with slug" in again.stderr
    assert "already stored" in again.stderr
    assert _counts(store) == before


def test_dry_run_stores_nothing(store: Store, tmp_path: Path) -> None:
    before = _counts(store)
    result = _run(store, tmp_path, "import", "--dry-run", str(INCIDENTS))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("would import 3 incident(s)")
    assert _counts(store) == before


def test_show_unknown_slug_and_missing_path_are_clean_errors(store: Store, tmp_path: Path) -> None:
    unknown = _run(store, tmp_path, "incidents", "show", "2026-01-01-nope")
    assert unknown.exit_code != 0
    assert "no incident with slug '2026-01-01-nope'" in unknown.stderr
    missing = _run(store, tmp_path, "import", str(tmp_path / "missing.md"))
    assert missing.exit_code != 0
    assert "missing.md: $: no such file or directory" in missing.stderr
    assert "Traceback" not in missing.output + missing.stderr


def test_the_default_database_lives_in_triage_home(tmp_path: Path) -> None:
    """Without TRIAGE_DATABASE_URL the CLI uses a SQLite file in TRIAGE_HOME."""
    home = tmp_path / "home"
    result = CliRunner().invoke(
        cli, ["import", str(INCIDENTS)], env={"TRIAGE_HOME": str(home), "TRIAGE_DATABASE_URL": None}
    )
    assert result.exit_code == 0, result.output
    assert (home / "triage.db").exists()
    listed = CliRunner().invoke(
        cli,
        ["incidents", "list", "--json"],
        env={"TRIAGE_HOME": str(home), "TRIAGE_DATABASE_URL": None},
    )
    assert len(json.loads(listed.stdout)) == 3
