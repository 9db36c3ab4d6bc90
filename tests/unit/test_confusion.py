"""The confusion table's logic, without a server: marks, rendering, exit status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from triage.drills import confusion
from triage.drills.confusion import (
    MISMATCH,
    MISSING,
    OFF_DIAGONAL,
    OK,
    Row,
    evaluate,
    exit_code,
    render,
)

CAUSES = ["reasoning-exhausts-budget", "quantized-weights", "model-file", "kv-cache-quant"]


def _truth(expected: str, accept: list[str] | None = None) -> dict[str, Any]:
    return {"expected": expected, "accept": accept or [expected]}


MANIFEST = {
    "drill": "d",
    "causes": {
        "model-file": _truth("confirmed"),
        "quantized-weights": _truth("suspected", ["suspected", "rejected"]),
        "reasoning-exhausts-budget": _truth("not-confirmed", ["rejected", "suspected"]),
    },
}


def _diagnosis(**statuses: str) -> dict[str, Any]:
    causes = [
        {"id": cid.replace("_", "-"), "status": s, "deciding_probe": "alt-weights"}
        for cid, s in statuses.items()
    ]
    arms = [
        {"name": "alt-weights", "n": 8, "failures": 0},
        {"name": "baseline", "n": 8, "failures": 8},
    ]
    return {"causes": causes, "arms": arms}


def _marks(row: Row) -> dict[str, str]:
    return {c.cause: c.mark for c in row.cells}


def test_diagonal_confirmation_and_accepted_verdicts_are_ok() -> None:
    row = evaluate(
        "d",
        MANIFEST,
        _diagnosis(
            model_file="confirmed",
            quantized_weights="rejected",
            reasoning_exhausts_budget="suspected",
            kv_cache_quant="rejected",
        ),
        CAUSES,
    )
    assert set(_marks(row).values()) == {OK}
    assert exit_code([row]) == 0
    model_file = next(c for c in row.cells if c.cause == "model-file")
    assert model_file.deciding == "alt-weights 0/8 vs 8/8"
    assert "**confirmed** (alt-weights 0/8 vs 8/8)" in render([row], CAUSES)


def test_confirmation_of_an_unlisted_or_unexpected_cause_is_off_diagonal() -> None:
    row = evaluate(
        "d",
        MANIFEST,
        _diagnosis(
            model_file="confirmed",
            quantized_weights="confirmed",  # listed, expected suspected
            reasoning_exhausts_budget="rejected",
            kv_cache_quant="confirmed",  # not listed at all
        ),
        CAUSES,
    )
    marks = _marks(row)
    assert marks["quantized-weights"] == OFF_DIAGONAL
    assert marks["kv-cache-quant"] == OFF_DIAGONAL
    assert exit_code([row]) == 1
    assert "off-diagonal confirmations: 2" in render([row], CAUSES)


def test_a_missed_expected_confirmation_is_a_mismatch() -> None:
    row = evaluate(
        "d",
        MANIFEST,
        _diagnosis(
            model_file="suspected",
            quantized_weights="rejected",
            reasoning_exhausts_budget="rejected",
        ),
        CAUSES,
    )
    assert _marks(row)["model-file"] == MISMATCH
    assert _marks(row)["kv-cache-quant"] == OK  # not listed, no verdict: not run
    assert exit_code([row]) == 1
    text = render([row], CAUSES)
    assert "suspected (alt-weights 0/8 vs 8/8) MISMATCH" in text and "mismatches: 1" in text


def test_a_listed_cause_without_a_verdict_is_missing() -> None:
    row = evaluate("d", MANIFEST, _diagnosis(model_file="confirmed"), CAUSES)
    assert _marks(row)["quantized-weights"] == MISSING
    assert exit_code([row]) == 1


def test_a_failed_diagnosis_fails_the_run_and_shows_its_error() -> None:
    ok = evaluate("ok", {"causes": {}}, _diagnosis(), CAUSES)
    broken = Row("broken", error="EngineError: server did not start")
    assert exit_code([ok]) == 0 and exit_code([ok, broken]) == 1
    text = render([ok, broken], CAUSES)
    assert "| broken | ERROR: EngineError: server did not start" in text
    assert "failed diagnoses: 1" in text


def test_failing_request_and_replay_cap_come_from_the_manifest() -> None:
    manifest = {
        "requests": [
            {"name": "contrast", "role": "contrast"},
            {"name": "sampled", "role": "failing", "expect": {"failure_rate": 0.3}},
            {"name": "greedy", "role": "failing", "expect": {"failure_rate": 1.0}},
        ]
    }
    assert confusion.failing_request(manifest) == ("sampled", confusion.INTERMITTENT_CAP)
    manifest["requests"] = manifest["requests"][2:]
    assert confusion.failing_request(manifest) == ("greedy", confusion.DETERMINISTIC_CAP)
    with pytest.raises(ValueError, match="no failing request"):
        confusion.failing_request({"drill": "x", "requests": []})


def test_unknown_drill_names_are_refused_before_any_server_starts() -> None:
    with pytest.raises(SystemExit, match="unknown drill"):
        confusion.main(["--drills", "no-such-drill"])


def test_every_registered_drill_manifest_is_one_the_table_can_read(tmp_path: Any) -> None:
    from triage.drills.real import RealModelMissing
    from triage.drills.registry import build_drill, list_drills

    catalogue = set(confusion.catalogue_causes())
    for name in list_drills():
        try:
            manifest = build_drill(name, tmp_path / name).manifest
        except RealModelMissing:  # a real-model drill before `make models`
            continue
        confirmed = [c for c, t in manifest["causes"].items() if t["expected"] == "confirmed"]
        # A drill exists to confirm its cause -- or, measured on a real model, to show a
        # failure no catalogue cause explains (the UNEXPLAINED verdict).
        assert confirmed or manifest.get("expected_verdict") == "unexplained", name
        assert set(manifest["causes"]) <= catalogue, name
        confusion.failing_request(manifest)


def test_a_drill_that_cannot_be_diagnosed_is_an_error_row_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    def broken(name: str, out: Any) -> Any:
        raise FileNotFoundError("official Gemma 4 chat template not found")

    monkeypatch.setattr(confusion, "build_drill", broken)
    row = confusion.run_drill("gemma4-toolcall", tmp_path, CAUSES, None)
    assert row.error.startswith("FileNotFoundError: official Gemma 4")
    assert exit_code([row]) == 1


def test_main_prints_the_table_writes_json_and_exits_nonzero_on_off_diagonal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        evaluate(
            "d", MANIFEST, _diagnosis(model_file="confirmed", quantized_weights="confirmed"), CAUSES
        )
    ]
    monkeypatch.setattr(confusion, "run", lambda names, cap=None, preconditions=True: rows)
    monkeypatch.setattr(confusion, "catalogue_causes", lambda: CAUSES)
    out = tmp_path / "rows.json"
    assert confusion.main(["--drills", "gemma4-toolcall", "--json", str(out)]) == 1
    assert "| d | " in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved[0]["drill"] == "d"
    marks = {c["cause"]: c["mark"] for c in saved[0]["cells"]}
    assert marks["quantized-weights"] == OFF_DIAGONAL


def test_a_drill_that_expects_unexplained_is_marked_on_the_verdict() -> None:
    manifest = {"causes": {}, "expected_verdict": "unexplained"}
    unexplained = {"causes": [], "arms": [], "verdict": {"status": "unexplained"}}
    row = confusion.evaluate("real", manifest, unexplained, [])
    assert [(c.cause, c.status, c.mark) for c in row.cells] == [
        (confusion.VERDICT, "unexplained", confusion.OK)
    ]
    explained = {**unexplained, "verdict": {"status": "explained"}}
    assert confusion.evaluate("real", manifest, explained, []).problems


def test_a_drill_that_expects_request_fields_is_marked_on_the_ablation() -> None:
    manifest = {
        "causes": {},
        "expected_verdict": "unexplained",
        "expected_request_fields": ["stop"],
    }
    named = {"status": "unexplained", "request_fields": ["stop (without-stop 0/8 vs 7/8)"]}
    row = confusion.evaluate("real", manifest, {"causes": [], "arms": [], "verdict": named}, [])
    assert not row.problems
    assert (confusion.FIELDS, "stop") in [(c.cause, c.status) for c in row.cells]
    nothing = {"causes": [], "arms": [], "verdict": {"status": "unexplained"}}
    assert confusion.evaluate("real", manifest, nothing, []).problems
