"""server-flags on the real llama-server: the `--no-jinja` drill's tools request is refused
(HTTP 500 "tools param requires --jinja flag") and the jinja-on arm confirms the cause (k/n,
no other cause confirmed); an unknown flag is named from the binary's own --help before
anything launches; a server that exits at startup is refused with its log line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import exchange_from_http
from triage.drills import build_drill
from triage.drills.flags import NAME
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.engine.servers import EngineError
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _diagnose(stack: Path, request: dict[str, Any], folder: Path, **capture: Any) -> Any:
    store = Store(f"sqlite:///{folder / 'kb.db'}")
    try:
        return diagnose(
            store,
            Intake(request, **capture),
            load_stack(stack),
            options=DiagnoseOptions(max_requests=16, log_dir=folder / "runs"),
        ).to_json()
    finally:
        store.close()


def test_no_jinja_with_tools_is_confirmed_by_the_jinja_arm(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    request = drill.request("greedy-tools")
    body = {"error": {"code": 500, "message": "tools param requires --jinja flag"}}
    exchange = exchange_from_http(request, body, status=500)
    findings = tuple(f.record() for f in classify(exchange))
    assert "server-flag-error" in {f.kind for f in findings if not f.passed}
    diagnosis = _diagnose(
        drill.out_dir / "stack.toml",
        request,
        tmp_path,
        exchange=exchange.to_dict(),
        findings=findings,
    )
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["server-flags"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == "jinja-on"
    base, arm = arms["baseline"], arms["jinja-on"]
    assert base["failures"] == base["n"] >= 4 and arm["failures"] == 0 and arm["n"] >= 4
    assert arm["ci95"][1] < base["ci95"][0]
    assert sorted(c for c, v in causes.items() if v["status"] == "confirmed") == ["server-flags"]
    assert running_servers() == []


def test_an_unknown_flag_is_named_before_anything_launches(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack = drill.out_dir / "stack.toml"
    stack.write_text(stack.read_text().replace('"-np"', '"--paralel"'))
    with pytest.raises(EngineError) as caught:
        _diagnose(stack, drill.request("greedy"), tmp_path)
    assert "--paralel (did you mean --parallel?)" in str(caught.value)
    assert "$.server.args" in str(caught.value)
    assert running_servers() == []


def test_a_server_that_exits_at_startup_is_refused_with_its_log_line(
    server_binary: Path, tmp_path: Path
) -> None:
    # The Gemma 4 template is not one llama-server knows without Jinja: with --no-jinja
    # b11434 exits with code 1 at startup ("this custom template is not supported").
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack = drill.out_dir / "stack.toml"
    stack.write_text(stack.read_text().replace('"-np"', '"--no-jinja", "-np"'))
    with pytest.raises(EngineError) as caught:
        _diagnose(stack, drill.request("greedy"), tmp_path)
    message = str(caught.value)
    assert "did not start" in message and "server-flags" in message
    assert "try using --jinja" in message
    assert running_servers() == []
