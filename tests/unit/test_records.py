"""Typed records between layers: stored JSON round-trips, older rows still read."""

from __future__ import annotations

import json

import pytest

from kb.domain.diagnosis import (
    Diagnosis,
    DiagnosisArm,
    DiagnosisError,
    GraphSummary,
    validate_diagnosis,
)
from kb.domain.records import ArmSummary, Reply


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
    summary = ArmSummary(
        "thinking-off", "off", "request", 8, 0, 0.0, [0.0, 0.32], 1.6e-4, 7.8e-5, "removes"
    )
    # the evidence line prints the p the decision used, not the two-sided one
    assert "0/8 failed, 95% CI 0.00-0.32, one-sided p=7.8e-05; removes" in (
        summary.evidence_summary()
    )
    row = DiagnosisArm.from_summary(summary, "E4").to_json()
    assert row["p_less"] == 7.8e-05 and row["p_value"] == 1.6e-04
    assert DiagnosisArm.from_json(row).p_less == 7.8e-05
    old = dict(row)
    del old["p_less"]  # a diagnosis stored before the field existed
    assert DiagnosisArm.from_json(old).p_less is None


def test_an_older_diagnosis_row_reads_with_defaults() -> None:
    stored = {
        "schema_version": 1,
        "incident": "x",
        "run_id": 1,
        "findings": [],
        "arms": [],
        "causes": [],
        "graph": {"nodes": 0, "edges": 0},
    }
    diagnosis = Diagnosis.from_json(stored)  # an older result: no state, no reproduction
    assert diagnosis.state == "done" and diagnosis.reproduction is None
    assert diagnosis.graph == GraphSummary(0, 0) and diagnosis.stack is None
    data = diagnosis.to_json()
    validate_diagnosis(data)
    assert Diagnosis.from_json(data).to_json() == data
    diagnosis.state = "exploded"
    with pytest.raises(DiagnosisError, match=r"\$\.state"):
        validate_diagnosis(diagnosis.to_json())


# A diagnosis as the engine stored it before its parts were typed records: every optional
# part present, keys in the order the dicts were built (the JSON column keeps that order).
STORED = {
    "schema_version": 1,
    "incident": "2026-06-10-gemma4-empty-response",
    "run_id": 3,
    "exchange_evidence": "E1",
    "findings": [
        {"kind": "length-stop", "passed": False, "score": 1.0, "reason": "cut", "where": "$"},
        {"kind": "empty-content", "passed": True, "score": 0.0, "reason": "ok", "where": None},
        # the model-file lint's findings keep their offset key
        {
            "kind": "chat-template-missing",
            "passed": False,
            "score": 1.0,
            "reason": "no template",
            "where": "gguf:tokenizer.chat_template",
            "offset": None,
        },
    ],
    "stack": {
        "server": {"binary": "/b/llama-server", "model": "/m/q.gguf", "args": ["-c"], "url": None},
        "speculative": True,
        "alternate_model": "/m/alt.gguf",
        "alternate_binary": None,
        "known_good": {"binary": None, "model": None, "args": [], "url": "http://h:1"},
        "host_workaround": None,
    },
    "arms": [
        {
            "name": "baseline",
            "variant": "as captured",
            "level": "request",
            "n": 8,
            "failures": 8,
            "rate": 1.0,
            "ci95": [0.68, 1.0],
            "p_value": None,
            "decision": "baseline",
            "stopped": "",
            "error": None,
            "speed_tok_s": 41.5,
            "draft_acceptance": None,
            "evidence": "E2",
            "p_less": None,
        }
    ],
    "observations": [
        {"name": "server-props", "speculative": True, "slots": 2, "evidence": "E3"},
        {"summary": "first", "name": "template-render", "evidence": None},
    ],
    "causes": [
        {
            "id": "token-limit",
            "status": "suspected",
            "rationale": "why",
            "evidence": [],
            "deciding_probe": "token-limit-lifted",
            "previous_status": None,
            "undecided": "not decided",
        }
    ],
    "undecided": ["token-limit: not decided"],
    "graph": {
        "nodes": 4,
        "edges": 3,
        "nodes_by_kind": {"cause": 1, "incident": 1},
        "edges_by_relation": {"supports": 3},
        "causes_by_status": {"suspected": 1},
    },
    "cost": {"requests": 8, "wall_seconds": 1.5, "server_seconds": 1.2, "launch_seconds": 0.3},
    "state": "done",
    "generated_at": "2026-06-10T12:00:00+00:00",
    "reproduction": {
        "reproduced": True,
        "message": "the baseline reproduces the captured failure",
        "signature": {"kinds": ["length-stop"], "finish_reason": "length", "status_class": "2xx"},
    },
    "skipped_arms": [{"arm": "spec-off", "reason": "no draft model"}],
    "verdict": {
        "status": "unexplained",
        "headline": "UNEXPLAINED: ...",
        "request_fields": ["stop (0/8 vs 8/8)"],
        "ruled_out": "ruled out none",
        "next_probes": ["vary the request"],
    },
}


def test_a_stored_diagnosis_reads_into_records_and_writes_back_byte_for_byte() -> None:
    validate_diagnosis(STORED)
    diagnosis = Diagnosis.from_json(STORED)
    assert [f.kind for f in diagnosis.findings if not f.passed] == [
        "length-stop",
        "chat-template-missing",
    ]
    assert diagnosis.stack is not None and diagnosis.stack.server is not None
    assert diagnosis.stack.server.model == "/m/q.gguf" and diagnosis.stack.known_good
    assert [o.name for o in diagnosis.observations] == ["server-props", "template-render"]
    assert diagnosis.verdict is not None and diagnosis.verdict.request_fields == [
        "stop (0/8 vs 8/8)"
    ]
    assert diagnosis.reproduction is not None and diagnosis.reproduction.signature is not None
    assert diagnosis.cost is not None and diagnosis.cost.requests == 8
    # The same bytes, key order included (`triage diagnose --json` sorts; the row does not).
    assert json.dumps(diagnosis.to_json()) == json.dumps(STORED)


def test_an_explained_verdict_writes_only_its_status_and_headline() -> None:
    stored = {**STORED, "verdict": {"status": "explained", "headline": "explained by: x"}}
    assert json.dumps(Diagnosis.from_json(stored).to_json()) == json.dumps(stored)
