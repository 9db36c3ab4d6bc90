"""client-handling and conversation-shape on their drills, diagnosed on the real
llama-server (issue 13). One diagnosis per drill (module-scoped), several assertions each.

client-content-only: the drill server's real stream (recorded here, streamed request at
temperature 0) and a content-only client's view of it form a client-view capture; the
engine must confirm client-handling from the streamed replays and a clean non-streamed
baseline, and confirm nothing else. conversation-python-args: a second turn whose history
holds Python-literal tool-call arguments (HTTP 500 on every replay); the history-normalised
arm must confirm conversation-shape, and nothing else may be confirmed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import load_file
from triage.drills import build_drill
from triage.drills.client import CONVERSATION_DRILL, STREAM_DRILL, record_capture
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.stackfile import load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _by_cause(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in diagnosis["causes"]}


def _arms(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in diagnosis["arms"]}


@pytest.fixture(scope="module")
def stream_run(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("client-drill")
    drill = build_drill(STREAM_DRILL, tmp / "drill")
    (exchange,) = load_file(record_capture(drill, tmp))
    diagnosis = diagnose(
        Store(f"sqlite:///{tmp / 'kb.db'}"),
        exchange,
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp / "runs"),
    ).to_json()
    return drill, exchange, diagnosis


@pytest.fixture(scope="module")
def conversation_run(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("conversation-drill")
    drill = build_drill(CONVERSATION_DRILL, tmp / "drill")
    diagnosis = diagnose(
        Store(f"sqlite:///{tmp / 'kb.db'}"),
        Intake(drill.request("second-turn")),
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp / "runs"),
    ).to_json()
    return drill, diagnosis


def _assert_manifest(diagnosis: dict[str, Any], manifest: dict[str, Any]) -> None:
    verdicts = _by_cause(diagnosis)
    for cause_id, truth in manifest["causes"].items():
        assert verdicts[cause_id]["status"] in truth["accept"], (cause_id, verdicts[cause_id])


def test_recorded_capture_is_the_server_answer_seen_by_a_lossy_client(stream_run: Any) -> None:
    _, exchange, _ = stream_run
    wire = exchange.wire_response["choices"][0]
    assert wire["finish_reason"] == "tool_calls"
    assert wire["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "empty-content" in {f.kind for f in classify(exchange) if not f.passed}


def test_client_handling_confirmed_with_k_of_n(stream_run: Any) -> None:
    drill, _, diagnosis = stream_run
    validate_diagnosis(diagnosis)
    _assert_manifest(diagnosis, drill.manifest)
    confirmed = [c["id"] for c in diagnosis["causes"] if c["status"] == "confirmed"]
    assert confirmed == ["client-handling"]
    baseline = _arms(diagnosis)["baseline"]
    assert baseline["failures"] == 0 and baseline["n"] >= 8 and baseline["ci95"][0] == 0.0
    # observation-only arms run once as hooks, never as replayed arms
    assert "client-view" not in _arms(diagnosis)
    assert "conversation-history" not in _arms(diagnosis)
    facts = next(o for o in diagnosis["observations"] if o.get("name") == "client-view")
    streamed = facts["streamed"]
    assert streamed["decision"] == "removes" and streamed["server_failures"] == 0
    assert streamed["client_failures"] >= 5 and streamed["n"] >= 8
    rationale = _by_cause(diagnosis)["client-handling"]["rationale"]
    assert "95% CI" in rationale and f"{streamed['client_failures']}/{streamed['n']}" in rationale
    assert _by_cause(diagnosis)["conversation-shape"]["status"] == "rejected"


def test_conversation_shape_confirmed_with_k_of_n(conversation_run: Any) -> None:
    drill, diagnosis = conversation_run
    validate_diagnosis(diagnosis)
    _assert_manifest(diagnosis, drill.manifest)
    confirmed = [c["id"] for c in diagnosis["causes"] if c["status"] == "confirmed"]
    assert confirmed == ["conversation-shape"]
    arms = _arms(diagnosis)
    baseline, arm = arms["baseline"], arms["history-normalised"]
    assert baseline["failures"] == baseline["n"] >= 4  # HTTP 500 on every replay
    assert arm["decision"] == "removes" and arm["failures"] == 0 and arm["n"] >= 4
    assert arm["ci95"][1] < baseline["ci95"][0]
    rationale = _by_cause(diagnosis)["conversation-shape"]["rationale"]
    assert "95% CI" in rationale and "JSON text" in rationale
    assert _by_cause(diagnosis)["client-handling"]["status"] != "confirmed"


def test_no_server_outlives_the_runs(stream_run: Any, conversation_run: Any) -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []


def _thinks(base_url: str, body: dict[str, Any]) -> bool:
    import httpx

    reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return bool(reply.json()["choices"][0]["message"].get("reasoning_content"))


def test_the_thinking_flags_called_dropped_are_ignored_by_the_server(
    stream_run: Any, server_factory: Any
) -> None:
    """dropped_thinking_flags names only placements this llama-server does not read."""
    from triage.engine.arms.client_view import dropped_thinking_flags

    drill = stream_run[0]
    server = server_factory(drill.model)
    body = {**drill.request("streamed"), "stream": False, "seed": 3}
    assert _thinks(server.base_url, body)
    documented = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    assert not _thinks(server.base_url, documented) and not dropped_thinking_flags(documented)
    for extra in (
        {"enable_thinking": False},
        {"think": False},
        {"thinking": {"type": "disabled"}},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ):
        assert dropped_thinking_flags({**body, **extra}), extra
        assert _thinks(server.base_url, {**body, **extra}), extra
