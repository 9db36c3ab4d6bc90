"""prompt-cache on the real llama-server: the prompt-cache-timestamp drill's five turns,
conversed with the time first in the system prompt, leave the last turn's cache_n at a few
tokens of thousands (the unstable-prefix finding); the prompt-cache-turns observation replays
the conversation turn by turn on one slot -- the time re-rendered every turn reuses nothing,
held fixed the cache gives back the earlier prompt -- and confirms prompt-cache, no other
cause. The drill's server is stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import load_file
from triage.drills import build_drill
from triage.drills.prompt_cache import NAME, record_capture
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.engine.arms.prompt_cache import ARM
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_a_timestamp_first_in_the_system_prompt_confirms_prompt_cache(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    (exchange,) = load_file(record_capture(drill, tmp_path / "capture"))
    timings = exchange.response["timings"]  # type: ignore[index]
    assert timings["cache_n"] < 0.1 * (timings["cache_n"] + timings["prompt_n"])
    findings = [f.record() for f in classify(exchange)]
    assert any(f.kind == "unstable-prefix" and not f.passed for f in findings)
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(exchange.request, exchange=exchange.to_dict(), findings=tuple(findings)),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    verdict = causes["prompt-cache"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == ARM
    assert "re-rendered every turn 8/8" in verdict["rationale"]
    assert "held fixed 0/8" in verdict["rationale"]
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["prompt-cache"]
    assert running_servers() == []
