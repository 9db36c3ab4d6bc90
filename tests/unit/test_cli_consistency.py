"""Issue 17, CLI consistency: `check --fail-on` for CI, one error prefix and exit-code
scheme (`Error: ...` and 1 for bad input, 2 for usage, 3 for a failed `--fail-on`),
and `triage incidents new` to open an incident by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kb.domain.slugs import SLUG_RE
from triage.cli import cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
LOG = FIXTURES / "exchanges.jsonl"  # lines 2, 3, 4, 6 fail; 1 and 5 are healthy


def run(*args: object) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture()
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    return url


def test_check_fail_on_exits_3_only_when_such_a_finding_fails() -> None:
    assert run("check", LOG).exit_code == 0  # without --fail-on: findings are not errors
    timeout = run("check", "--fail-on", "timeout", LOG)
    assert timeout.exit_code == 3
    assert "FAIL: timeout" in timeout.stdout  # the findings are still printed
    assert run("check", "--fail-on", "any", LOG).exit_code == 3
    assert run("check", "--fail-on", "tool-markup-leaked", LOG).exit_code == 0
    assert (
        run("check", "--fail-on", "tool-markup-leaked", "--fail-on", "length-stop", LOG).exit_code
        == 3
    )
    healthy = run("check", "--exchange", 1, "--fail-on", "any", "--json", LOG)
    assert healthy.exit_code == 0 and json.loads(healthy.stdout)[0]["findings"]


def test_check_fail_on_an_unknown_kind_is_a_usage_error_naming_the_kinds() -> None:
    result = run("check", "--fail-on", "timout", LOG)
    assert result.exit_code == 2
    assert "unknown finding kind 'timout'" in result.stderr and "timeout" in result.stderr


def test_bad_input_reads_the_same_in_check_capture_and_incidents(db: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    for result in (
        run("check", bad),
        run("capture", bad),
        run("capture", "--incident", "2026-01-01-nope", LOG),
        run("incidents", "show", "2026-01-01-nope"),
    ):
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("Error: "), result.stderr
        assert "Traceback" not in result.output


def test_incidents_new_opens_an_incident_that_capture_can_attach_to(db: str) -> None:
    opened = run("incidents", "new", "Modèle ÜBER² answers empty", "--model", "Modèle-qat")
    assert opened.exit_code == 0, opened.output
    slug = opened.stdout.strip().removeprefix("opened incident ")
    assert SLUG_RE.match(slug) and slug.endswith("-modele-uber2-answers-empty")
    again = run("incidents", "new", "Modèle ÜBER² answers empty", "--json")
    assert json.loads(again.stdout)["slug"] == f"{slug}-2"

    captured = run("capture", "--incident", slug, "--exchange", 2, LOG)
    assert captured.exit_code == 0, captured.output
    shown = json.loads(run("incidents", "show", slug, "--json").stdout)
    assert shown["title"] == "Modèle ÜBER² answers empty" and shown["status"] == "open"
    assert [e["kind"] for e in shown["evidence"]] == ["exchange"]


@pytest.mark.parametrize(
    "title, message", [("   ", "title: must not be empty"), ("x" * 301, "title: 301 characters")]
)
def test_incidents_new_refuses_a_bad_title(db: str, title: str, message: str) -> None:
    result = run("incidents", "new", title)
    assert result.exit_code == 1 and f"Error: {message}" in result.stderr
    assert "no incidents" in run("incidents", "list").stdout


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_decide_example_is_accepted_as_written(db: str, tmp_path: Path) -> None:
    """The README's `triage decide ... --revisit-on ...` line, expanded by bash as a user's
    shell would (its revisit date is relative to today), is accepted today."""
    import subprocess

    line = next(
        text.split("triage ", 1)[1]
        for text in README.read_text("utf-8").splitlines()
        if text.startswith("triage decide SLUG --parked")
    )
    expanded = subprocess.run(
        ["bash", "-c", f"set -- {line}; printf '%s\\0' \"$@\""],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")[:-1]
    slug = run("incidents", "new", "README example", "--json")
    assert slug.exit_code == 0, slug.output
    argv = [json.loads(slug.stdout)["slug"] if a == "SLUG" else a for a in expanded]
    assert "--revisit-on" in argv and argv[argv.index("--revisit-on") + 1] != ""
    decided = run(*argv)
    assert decided.exit_code == 0, decided.output
    assert "PARKED" in decided.stdout
