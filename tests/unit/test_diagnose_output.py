"""Issue 17: what `triage diagnose` prints -- progress lines with elapsed time and an ETA,
the one-sided p the decisions use, the tok/s column explained, observations as sentences."""

from __future__ import annotations

from typing import Any

import pytest

from triage.commands.engine import (
    TOK_S_NOTE,
    ProgressPrinter,
    format_diagnosis,
    observation_sentence,
)
from triage.engine.runner import ProgressEvent


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_carry_elapsed_time_and_an_eta(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ProgressEvent("launch", "starting the incident's server"))
    clock.now += 5
    show(ProgressEvent("plan", "5 request arms, 2 server arms"))
    clock.now += 10  # one look: 10 s
    show(ProgressEvent("probe", "look 1/4: 4 replays for a, b", 1, 4))
    clock.now += 10
    show(ProgressEvent("probe", "look 2/4: 8 replays for a", 2, 4))
    clock.now += 3
    show(ProgressEvent("launch", "starting server for spec-off"))
    clock.now += 10  # launch + first look of the server arm: 10 s
    show(ProgressEvent("probe", "look 1/4: 4 replays for spec-off", 1, 4))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("starting the incident's server  (0:00 elapsed)")
    assert lines[1].endswith("(0:05 elapsed)")
    # 10 s a look: 3 looks left here + 2 server arms x 4 looks = 110 s at most.
    assert lines[2].endswith("look 1/4: 4 replays for a, b  (0:15 elapsed, at most ~1:50 left)")
    assert lines[3].endswith("(0:25 elapsed, at most ~1:40 left)")
    # In the first server arm: 3 looks left + 1 server arm x 4 looks, at 10 s a look.
    assert lines[5].endswith("(0:38 elapsed, at most ~1:10 left)")
    assert "[#####...............] 1/4" in lines[5]


def test_a_known_good_search_is_named_in_the_eta(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ProgressEvent("plan", "2 request arms, 0 server arms, known-good search over ['model']"))
    clock.now += 6
    show(ProgressEvent("probe", "look 1/2", 1, 2))
    line = capsys.readouterr().err.splitlines()[1]
    assert line.endswith("(0:06 elapsed, at most ~0:06 left + the known-good search)")


def test_progress_without_a_plan_shows_elapsed_only(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ProgressEvent("crash", "the server crashed at startup; diagnosing the crash"))
    clock.now += 4
    show(ProgressEvent("probe", "look 1/2", 1, 2))
    assert capsys.readouterr().err.splitlines()[1].endswith("(0:04 elapsed)")


def _diagnosis() -> dict[str, Any]:
    arm = {"n": 8, "failures": 0, "rate": 0.0, "ci95": [0.0, 0.32], "decision": "removes"}
    return {
        "incident": "2026-12-01-x",
        "run_id": 3,
        "arms": [
            {
                **arm,
                "name": "baseline",
                "failures": 8,
                "rate": 1.0,
                "ci95": [0.68, 1.0],
                "decision": "baseline",
                "p_value": None,
                "p_less": None,
                "speed_tok_s": 453.47,
            },
            {
                **arm,
                "name": "thinking-off",
                "p_value": 0.000155,
                "p_less": 7.77e-05,
                "speed_tok_s": 1316.81,
            },
            {**arm, "name": "old-record", "p_value": 0.0372, "speed_tok_s": None},
        ],
        "observations": [
            {
                "name": "template-render",
                "thinking_on": True,
                "thinking_on_with_enable_thinking_false": False,
                "prompt_tail": "<|turn>",
                "evidence": "E63",
            },
            {
                "name": "spec-divergence",
                "seeds": 4,
                "diverged": 1,
                "first_positions": [17],
                "temperature": 0.0,
                "evidence": "E65",
            },
            {"name": "server-props", "build_info": "b1"},
        ],
    }


def test_printed_p_is_the_one_sided_one_and_tok_s_is_explained() -> None:
    text = format_diagnosis(_diagnosis())
    lines = text.splitlines()
    thinking = next(line for line in lines if line.strip().startswith("thinking-off"))
    assert "p=7.8e-05" in thinking and "0.000155" not in thinking
    assert "1317 tok/s" in thinking
    old = next(line for line in lines if line.strip().startswith("old-record"))
    assert "p(two-sided)=0.037" in old
    assert "one-sided p that the arm fails less than the baseline" in text
    assert TOK_S_NOTE in text and "mean decode speed" in TOK_S_NOTE


def test_observations_are_sentences_not_json() -> None:
    text = format_diagnosis(_diagnosis())
    observed = text.split("Observations:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert observed == [
        "  - Template render: thinking ON by default for this request; with "
        "enable_thinking=false: off. [E63]",
        "  - Speculative vs plain decoding at fixed seeds: streams diverged in 1/4 seeds, "
        "first at token 17. [E65]",
    ]
    assert "{" not in text and "server-props" not in text  # not a printed observation
    assert (
        observation_sentence({"name": "plugin-fact", "ok": False, "sizes": [1, 2]})
        == "Plugin-fact: ok no; sizes 1, 2."
    )


def test_the_one_sided_p_is_read_from_the_stored_arm(tmp_path: Any) -> None:
    from datetime import date

    from kb.models import Incident
    from kb.store import Store, add_evidence
    from triage.commands.engine import with_one_sided_p

    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        with store.session() as session:
            incident = Incident(slug="2026-12-01-x", title="x", opened_on=date(2026, 12, 1))
            session.add(incident)
            session.flush()
            add_evidence(
                session,
                incident_id=incident.id,
                kind="measurement",
                summary="arm thinking-off: 0/8 failed",
                payload={
                    "type": "arm",
                    "arm": "thinking-off",
                    "p_value": 0.000155,
                    "p_less": 7.77e-05,
                },
                key="E55",
            )
        diagnosis = _diagnosis()
        diagnosis["arms"][1] = {**diagnosis["arms"][1], "evidence": "E55"}
        del diagnosis["arms"][1]["p_less"]
        printable = with_one_sided_p(store, diagnosis)
    finally:
        store.close()
    assert "p_less" not in diagnosis["arms"][1]  # the diagnosis itself is left as it was
    thinking = next(
        line for line in format_diagnosis(printable).splitlines() if "thinking-off" in line
    )
    assert "p=7.8e-05" in thinking
