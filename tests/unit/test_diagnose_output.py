"""Issue 17: what `triage diagnose` prints -- progress lines with elapsed time and an ETA,
the one-sided p the decisions use, the tok/s column explained, observations as sentences."""

from __future__ import annotations

from typing import Any

import pytest

from kb.domain.diagnosis import Diagnosis, Observation
from kb.domain.records import Reply
from triage.commands.engine import (
    TOK_S_NOTE,
    ProgressPrinter,
    format_diagnosis,
    observation_sentence,
)
from triage.engine.eta import eta_bound
from triage.engine.events import ArmsPlanned, LookStarted, ProgressEvent
from triage.engine.scheduler import ArmState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _replies(arm: str, count: int, seconds: float) -> list[Reply]:
    return [
        Reply(arm, i, 1000 + i, True, ["length-stop"], "length", 0, 0, 200, seconds, {})
        for i in range(count)
    ]


def test_the_eta_bound_is_replays_left_times_measured_time_over_slots() -> None:
    baseline = ArmState("baseline", "as is", "request", "incident")
    arm = ArmState("token-limit-x4", "x4", "request", "incident", ("token-limit",))
    server_arm = ArmState("spec-off", "no draft", "server", "spec-off-server", ("spec",))
    # Nothing timed yet: no bound at all.
    assert eta_bound([baseline, arm, server_arm], 16, {"incident": 2}) is None
    baseline.replies = _replies("baseline", 4, 10.0)  # 10 s a replay, 2 at once
    arm.replies = _replies("token-limit-x4", 4, 30.0)  # its own replies are slower
    bound = eta_bound([baseline, arm, server_arm], 16, {"incident": 2})
    assert bound is not None
    # baseline 12 left x the incident server's mean (4x10 + 4x30)/8 = 20 s / 2 slots = 120 s;
    # the arm 12 x 20 / 2 = 120 s; the server arm, not started: 16 x the overall 20 s / 1.
    assert bound.replays == 12 + 12 + 16
    assert bound.seconds == pytest.approx(120 + 120 + 320)
    # A decided arm adds nothing; once every other arm is done, neither does the baseline.
    arm.decision = "removes"
    server_arm.error = "server failed"
    done = eta_bound([baseline, arm, server_arm], 16, {"incident": 2})
    assert done is not None and done.seconds == 0 and done.replays == 0


def test_progress_lines_carry_elapsed_time_and_the_engines_eta_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ProgressEvent("launch", "starting the incident's server"))
    clock.now += 5
    show(ArmsPlanned(5, 2))
    clock.now += 10
    show(LookStarted(1, 4, 4, ("a", "b"), eta=None))
    clock.now += 10
    show(LookStarted(2, 4, 8, ("a",), eta=110.0))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("starting the incident's server  (0:00 elapsed)")
    assert lines[1].endswith("5 request arms, 2 server arms  (0:05 elapsed)")
    # Nothing measured yet: no bound is promised.
    assert lines[2].endswith("look 1/4: 4 replays for a, b  (0:15 elapsed)")
    assert lines[3].endswith("(0:25 elapsed, at most ~1:50 left at the measured pace)")
    assert "[##########..........] 2/4" in lines[3]


def test_a_known_good_search_is_named_in_the_eta(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ArmsPlanned(2, 0, known_good=("model",)))
    clock.now += 6
    show(ProgressEvent("probe", "look 1/2", 1, 2, eta=6.0))
    first, line = capsys.readouterr().err.splitlines()
    assert "2 request arms, 0 server arms, known-good search over ['model']" in first
    assert line.endswith(
        "(0:06 elapsed, at most ~0:06 left at the measured pace + the known-good search)"
    )


def test_progress_without_a_bound_shows_elapsed_only(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    show = ProgressPrinter(clock)
    show(ProgressEvent("crash", "the server crashed at startup; diagnosing the crash"))
    clock.now += 4
    show(ProgressEvent("probe", "look 1/2", 1, 2))
    assert capsys.readouterr().err.splitlines()[1].endswith("(0:04 elapsed)")


def _stored() -> dict[str, Any]:
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


def _diagnosis() -> Diagnosis:
    return Diagnosis.from_json(_stored())


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
        observation_sentence(Observation({"name": "plugin-fact", "ok": False, "sizes": [1, 2]}))
        == "Plugin-fact: ok no; sizes 1, 2."
    )


def test_the_one_sided_p_is_read_from_the_stored_arm(tmp_path: Any) -> None:
    from datetime import date

    from kb.models import Incident
    from kb.repo.store import Store, add_evidence
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
        stored = _stored()
        stored["arms"][1] = {**stored["arms"][1], "evidence": "E55"}
        del stored["arms"][1]["p_less"]  # a diagnosis stored before the field existed
        diagnosis = Diagnosis.from_json(stored)
        printable = with_one_sided_p(store, diagnosis)
    finally:
        store.close()
    assert diagnosis.arms[1].p_less is None  # the diagnosis itself is left as it was
    assert printable.arms[1].p_less == 7.77e-05
    thinking = next(
        line for line in format_diagnosis(printable).splitlines() if "thinking-off" in line
    )
    assert "p=7.8e-05" in thinking
