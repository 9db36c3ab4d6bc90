"""UNEXPLAINED is a verdict (issue 23): a run whose failure reproduces and that confirms no
cause says so -- headline, what was ruled out in one line, the next probes -- in the JSON,
the CLI text and exit status, the UI and the retrospective."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import click
import pytest

from kb.domain.diagnosis import Diagnosis, DiagnosisArm, DiagnosisCause, Finding
from kb.domain.retro import retro_markdown, unexplained
from kb.repo.files import import_paths, load_record
from kb.repo.store import Store
from triage.commands.engine import EXIT_UNEXPLAINED, _exit_for_state, format_diagnosis
from triage.engine.diagnosis import UNEXPLAINED, overall_verdict
from triage.ui.runs import IncidentRuns, unexplained_parts

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"


def _verdict(*args: Any) -> dict[str, Any]:
    """The overall verdict as the diagnosis JSON holds it."""
    return overall_verdict(*args).to_json()


def _arm(name: str, k: int, n: int) -> DiagnosisArm:
    return DiagnosisArm.from_json(
        {
            "name": name,
            "variant": "",
            "level": "request",
            "n": n,
            "failures": k,
            "rate": k / n,
            "ci95": [0, 1],
            "p_value": None,
            "decision": "baseline",
        }
    )


def _cause(cause: str, status: str, probe: str) -> DiagnosisCause:
    return DiagnosisCause(cause, status, "why", [], probe, None, None)


CAUSES = [
    _cause("token-limit", "rejected", "token-limit-lifted"),
    _cause("context-size", "rejected", "context-lifted"),
    _cause("quantized-weights", "suspected", "alt-weights ([alternates] model)"),
]


def test_reproduced_and_nothing_confirmed_is_unexplained() -> None:
    verdict = _verdict("done", CAUSES, [_arm("baseline", 8, 8)])
    assert verdict["status"] == UNEXPLAINED
    assert verdict["headline"].startswith("UNEXPLAINED")
    assert "baseline 8/8 failing" in verdict["headline"]
    assert verdict["ruled_out"] == (
        "ruled out 2: token-limit (token-limit-lifted), context-size (context-lifted)"
    )
    assert "\n" not in verdict["ruled_out"]  # one line
    assert verdict["next_probes"][0] == "quantized-weights: alt-weights ([alternates] model)"


def test_a_confirmed_cause_or_an_unfinished_run_is_not_unexplained() -> None:
    confirmed = [*CAUSES, _cause("model-loop", "confirmed", "sampling")]
    assert _verdict("done", confirmed, [])["status"] == "explained"
    assert _verdict("not-reproduced", CAUSES, [])["status"] == "not-reproduced"
    assert _verdict("partial", CAUSES, [])["status"] == "partial"


def test_a_baseline_that_never_failed_is_not_called_reproduced() -> None:
    """A finished run whose baseline replays all succeeded and that confirms nothing must not
    say "the failure reproduces": it is not reproduced, and the CLI exits non-zero."""
    verdict = _verdict("done", CAUSES, [_arm("baseline", 0, 16)])
    assert verdict["status"] == "not-reproduced"
    assert "reproduces" not in verdict["headline"]
    assert "0/16" in verdict["headline"]
    with pytest.raises(click.ClickException) as stopped:
        _exit_for_state(Diagnosis.from_json({"incident": "i", "state": "done", "verdict": verdict}))
    assert "0/16" in stopped.value.message
    confirmed = [*CAUSES, _cause("stream-format", "confirmed", "stream-vs-nonstream")]
    assert _verdict("done", confirmed, [_arm("baseline", 0, 16)])["status"] == "explained"


def _stored() -> dict[str, Any]:
    verdict = _verdict("done", CAUSES, [_arm("baseline", 8, 8)])
    return {"incident": "i", "run_id": 3, "arms": [], "causes": [], "verdict": verdict}


def _diagnosis(**changes: Any) -> Diagnosis:
    return Diagnosis.from_json({**_stored(), **changes})


def test_the_cli_prints_it_and_exits_with_its_own_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = format_diagnosis(_diagnosis())
    assert text.splitlines()[2].startswith("UNEXPLAINED: the failure reproduces")
    assert "ruled out 2: token-limit" in text and "next:" in text
    with pytest.raises(SystemExit) as stopped:
        _exit_for_state(_diagnosis())
    assert stopped.value.code == EXIT_UNEXPLAINED == 4
    _exit_for_state(_diagnosis(verdict={"status": "explained", "headline": "x"}))  # exit 0
    with pytest.raises(click.ClickException):
        _exit_for_state(_diagnosis(state="not-reproduced", verdict=None))


def test_the_ui_shows_the_latest_runs_unexplained_verdict() -> None:
    from kb.repo.runlog import RunInfo

    run = RunInfo(3, "done", "2026-12-01T16:00:00", "", _stored())
    parts = unexplained_parts(IncidentRuns([run]), None)
    assert parts is not None
    headline, ruled_out, probes = parts
    assert headline.startswith("UNEXPLAINED") and "token-limit" in ruled_out and probes
    explained = RunInfo(4, "done", "", "", {"verdict": {"status": "explained"}})
    assert unexplained_parts(IncidentRuns([explained, run]), None) is None
    assert unexplained_parts(IncidentRuns([explained, run]), 3) is not None


def test_the_retrospective_says_unexplained_with_citations() -> None:
    store = Store("sqlite://")
    try:
        import_paths(store, [INCIDENTS])
        with store.session(readonly=True) as session:
            record = load_record(session, "2026-06-10-gemma4-empty-response")
    finally:
        store.close()
    assert not unexplained(record)  # the reference incident has a confirmed cause
    assert "UNEXPLAINED" not in retro_markdown(record)
    record = copy.deepcopy(record)
    # As a diagnosis leaves it: an arm measurement on record, nothing confirmed.
    arm = {"type": "arm", "arm": "baseline", "n": 8, "failures": 8, "decision": "baseline"}
    record["evidence"].append({"id": "E99", "payload": arm, "summary": "baseline 8/8"})
    for cause in record["causes"]:
        if cause["status"] == "confirmed":
            cause["status"] = "rejected"
    assert unexplained(record)
    line = next(li for li in retro_markdown(record).splitlines() if "UNEXPLAINED" in li)
    assert "no cause in the catalogue is confirmed" in line and "](#" in line  # cited


def test_failed_model_file_lint_findings_come_first_in_the_next_probes() -> None:
    lint = [
        Finding("base-model-for-chat", False, 1.0, "base model"),
        Finding("chat-template-missing", True, 0.0, "has one"),
    ]
    verdict = _verdict("done", CAUSES, [_arm("baseline", 8, 8)], lint)
    assert verdict["next_probes"][0].startswith("model file: serve an instruction-tuned model")
    assert not any("chat template (--chat-template-file)" in p for p in verdict["next_probes"])
