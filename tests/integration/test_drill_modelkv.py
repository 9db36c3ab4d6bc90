"""kv-cache-quant and model-file on their drills, diagnosed on the real llama-server.

Each drill is diagnosed once (module-scoped); the tests read that diagnosis. Verdicts are
checked against the drill's manifest, and through the confusion table's own logic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.files import load_record
from kb.repo.store import Store
from triage.drills import Drill, build_drill
from triage.drills.confusion import catalogue_causes, evaluate, exit_code
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.stackfile import load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _diagnose(name: str, tmp: Path) -> tuple[Drill, dict[str, Any], dict[str, Any]]:
    """(drill, diagnosis, the failure kinds of each arm's failing replies from the KB)."""
    drill = build_drill(name, tmp / "drill")
    store = Store(f"sqlite:///{tmp / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("greedy")),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=16, log_dir=tmp / "runs"),
        ).to_json()
        with store.session(readonly=True) as session:
            evidence = {e["id"]: e for e in load_record(session, diagnosis["incident"])["evidence"]}
    finally:
        store.close()
    validate_diagnosis(diagnosis)
    kinds = {a["name"]: evidence[a["evidence"]]["payload"]["kinds"] for a in diagnosis["arms"]}
    return drill, diagnosis, kinds


@pytest.fixture(scope="module")
def kv_run(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _diagnose("kv-cache-q4", tmp_path_factory.mktemp("kv"))


@pytest.fixture(scope="module")
def model_file_run(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _diagnose("model-file-token-type", tmp_path_factory.mktemp("model-file"))


def _by_id(items: list[dict[str, Any]], key: str = "id") -> dict[str, dict[str, Any]]:
    return {item[key]: item for item in items}


def _assert_confirmed_alone(drill: Drill, diagnosis: dict[str, Any], cause: str, arm: str) -> None:
    causes, arms = _by_id(diagnosis["causes"]), _by_id(diagnosis["arms"], "name")
    assert causes[cause]["status"] == "confirmed", causes[cause]
    assert causes[cause]["deciding_probe"] == arm
    # k/n with an interval: the arm removes a failure the baseline reproduces every time.
    base, decisive = arms["baseline"], arms[arm]
    assert base["failures"] == base["n"] >= 4
    assert decisive["decision"] == "removes" and decisive["failures"] == 0
    assert decisive["n"] >= 4 and decisive["p_value"] < 0.05
    assert decisive["ci95"][1] < base["ci95"][0]
    assert "95% CI" in causes[cause]["rationale"]
    others = [c for c, v in causes.items() if c != cause and v["status"] == "confirmed"]
    assert others == []
    for cause_id, truth in drill.manifest["causes"].items():
        assert causes[cause_id]["status"] in truth["accept"], (cause_id, causes[cause_id])
    assert exit_code([evaluate(drill.name, drill.manifest, diagnosis, catalogue_causes())]) == 0


def test_kv_cache_quant_confirmed_by_the_f16_cache_arm(kv_run: Any) -> None:
    drill, diagnosis, kinds = kv_run
    _assert_confirmed_alone(drill, diagnosis, "kv-cache-quant", "kv-f16")
    arms = _by_id(diagnosis["arms"], "name")
    assert "was K q4_0, V q4_0" in arms["kv-f16"]["variant"]
    # Every failing reply is the designed mojibake answer, nothing else (no parse failure,
    # no length stop), and thinking off does not avoid it.
    assert kinds["baseline"] == {"mojibake": arms["baseline"]["failures"]}
    assert arms["thinking-off"]["decision"] == "unchanged"
    assert kinds["thinking-off"] == {"mojibake": arms["thinking-off"]["failures"]}


def test_model_file_confirmed_by_a_same_quant_conversion(model_file_run: Any) -> None:
    drill, diagnosis, kinds = model_file_run
    # The broken conversion drops the delimiter: no tool call, empty content.
    assert kinds["baseline"] == {
        "empty-content": _by_id(diagnosis["arms"], "name")["baseline"]["n"]
    }
    _assert_confirmed_alone(drill, diagnosis, "model-file", "alt-weights")
    causes = _by_id(diagnosis["causes"])
    assert "type 3 vs 4" in causes["model-file"]["rationale"]
    assert causes["quantized-weights"]["status"] == "suspected"
    observations = _by_id(diagnosis["observations"], "name")
    assert observations["weights-confounder"]["quantization"] == ["Q4_0", "Q4_0"]
    # No quantized KV cache on this server: rejected without a kv-f16 launch.
    assert causes["kv-cache-quant"]["status"] == "rejected"
    assert "kv-f16" not in _by_id(diagnosis["arms"], "name")


def test_no_server_left_running(kv_run: Any, model_file_run: Any) -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []
