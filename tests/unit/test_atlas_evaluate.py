"""`python -m triage.atlas.evaluate`: precision, recall and false alarms of the top-3
matches on the held-out cases, recomputed and compared with what the README claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kb.atlas import load_atlas
from kb.atlas.loader import SHIPPED_DIR
from triage.atlas.evaluate import EvaluationError, evaluate, main

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ROOT / "tests" / "fixtures" / "atlas_eval"
FIXTURES = ROOT / "tests" / "fixtures" / "atlas"


def readme_rate(label: str) -> tuple[int, int, float]:
    """(k, n, rate) of one row of the README's Atlas table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Atlas") :]
    match = re.search(rf"^\| {label}[^|]*\| (\d+)/(\d+) \| ([0-9.]+) \|", section, re.MULTILINE)
    assert match, f"README's Atlas table has no {label!r} row"
    return int(match.group(1)), int(match.group(2)), float(match.group(3))


def test_the_held_out_numbers_are_at_least_what_the_readme_claims() -> None:
    evaluation = evaluate(HELD_OUT, load_atlas([SHIPPED_DIR]))
    data = evaluation.to_dict()
    correct, returned, _ = readme_rate("precision")
    hits, positives, _ = readme_rate("recall")
    alarms, negatives, _ = readme_rate("false alarms")
    assert len(evaluation.positives) >= positives and len(evaluation.negatives) >= negatives
    # the rates, compared as fractions (the table's rates are rounded)
    assert data["precision"]["rate"] >= round(correct / returned, 4)
    assert data["recall"]["rate"] >= round(hits / positives, 4)
    assert data["false_alarms"]["rate"] <= round(alarms / negatives, 4)


def test_the_fixture_cases_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(FIXTURES / "cases"), "--atlas", str(FIXTURES / "entries")]) == 0
    out = capsys.readouterr().out
    assert "precision (returned matches that are expected): 4/4 = 1.00" in out
    assert "recall (expected entry in the top 3):           4/4 = 1.00" in out
    assert "false alarms (expect: [] cases with a match):   0/3 = 0.00" in out


def test_a_case_missing_its_expectation_is_named(tmp_path: Path) -> None:
    case = tmp_path / "one"
    case.mkdir()
    (case / "case.yaml").write_text("input: server.log\nkind: log\n", encoding="utf-8")
    with pytest.raises(EvaluationError, match=r"one/case.yaml: \$.expect: missing"):
        evaluate(tmp_path, [])
    (case / "case.yaml").write_text(
        "input: ../../etc/passwd\nkind: log\nexpect: []\n", encoding="utf-8"
    )
    with pytest.raises(EvaluationError, match=r"\$.input: must be a file name"):
        evaluate(tmp_path, [])
