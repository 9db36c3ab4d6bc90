"""Typed records between layers: stored JSON round-trips, older rows still read."""

from __future__ import annotations

import pytest

from kb.domain.records import ArmSummary, Diagnosis, DiagnosisError, Reply


def test_a_reply_round_trips_and_keeps_its_text_bounded() -> None:
    reply = Reply(
        "baseline",
        3,
        1003,
        True,
        ["length-stop"],
        "length",
        0,
        900,
        200,
        0.12345,
        {"draft_n": 4},
        text="x" * 10_000,
    )
    data = reply.to_dict()
    assert data["type"] == "reply" and len(data["text"]) == 4000 and data["elapsed_s"] == 0.1235
    back = Reply.from_dict(data)
    assert (back.arm, back.index, back.failed, back.kinds) == ("baseline", 3, True, ["length-stop"])
    assert "FAIL length-stop" in back.summary()


def test_an_arm_summary_round_trips_and_reads_old_payloads() -> None:
    arm = ArmSummary(
        "spec-off",
        "no draft",
        "server",
        8,
        8,
        1.0,
        [0.68, 1.0],
        1.0,
        1.0,
        "unchanged",
        kinds={"length-stop": 8},
    )
    assert ArmSummary.from_dict(arm.to_dict()) == arm
    old = ArmSummary.from_dict({"type": "arm", "arm": "baseline", "n": 8, "failures": 2})
    assert old.rate == 0.25 and old.decision == "undecided"
    assert "2/8 failed" in old.evidence_summary()


def test_a_diagnosis_arm_carries_the_one_sided_p_its_decision_used() -> None:
    from kb.domain.records import DiagnosisArm

    summary = ArmSummary(
        "thinking-off", "off", "request", 8, 0, 0.0, [0.0, 0.32], 1.6e-4, 7.8e-5, "removes"
    )
    # the evidence line prints the p the decision used, not the two-sided one
    assert "0/8 failed, 95% CI 0.00-0.32, one-sided p=7.8e-05; removes" in (
        summary.evidence_summary()
    )
    row = DiagnosisArm.from_summary(summary, "E4").to_dict()
    assert row["p_less"] == 7.8e-05 and row["p_value"] == 1.6e-04
    assert DiagnosisArm.from_dict(row).p_less == 7.8e-05
    old = dict(row)
    del old["p_less"]  # a diagnosis stored before the field existed
    assert DiagnosisArm.from_dict(old).p_less is None


def test_a_diagnosis_round_trips_and_is_validated_where_it_is_built() -> None:
    stored = {
        "schema_version": 1,
        "incident": "x",
        "run_id": 1,
        "findings": [],
        "arms": [],
        "causes": [],
        "graph": {"nodes": 0, "edges": 0},
    }
    diagnosis = Diagnosis.from_dict(stored)  # an older result: no state, no reproduction
    assert diagnosis.state == "done" and diagnosis.reproduction is None
    assert Diagnosis.from_dict(diagnosis.validated()).to_dict() == diagnosis.to_dict()
    diagnosis.state = "exploded"
    with pytest.raises(DiagnosisError, match=r"\$\.state"):
        diagnosis.validated()
