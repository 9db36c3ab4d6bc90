"""schema-not-enforced on the real llama-server: the drill's schema sent as vLLM's
`guided_json` (a field b11434 does not read) gets plain text with HTTP 200 (a schema-violation
finding); the schema-relocated arm (the same schema in response_format.json_schema) is
enforced and confirms the cause (k/n, no other cause confirmed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import exchange_from_http
from triage.drills import build_drill
from triage.drills.schema import NAME
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_a_schema_in_guided_json_is_confirmed_unenforced_by_the_relocated_arm(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    request = drill.request("greedy-guided-json")
    reply = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "It is in Paris."},
            }
        ]
    }
    exchange = exchange_from_http(request, reply, status=200)
    findings = [f.record() for f in classify(exchange)]
    violations = [f for f in findings if f.kind == "schema-violation" and not f.passed]
    assert violations and "guided_json" in violations[0].reason
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(request, exchange=exchange.to_dict(), findings=tuple(findings)),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["schema-not-enforced"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == "schema-relocated"
    base, arm = arms["baseline"], arms["schema-relocated"]
    assert base["failures"] == base["n"] >= 4 and arm["failures"] == 0 and arm["n"] >= 4
    assert arm["ci95"][1] < base["ci95"][0]
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["schema-not-enforced"]
    assert running_servers() == []
