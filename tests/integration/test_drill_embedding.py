"""embedding-batch on the real llama-server: the drill's `/v1/embeddings` request (a short and
a ~1000-token input, `-ub 256 -b 256`) is refused with HTTP 500 "input (N tokens) is too large
to process. increase the physical batch size"; captured as a pair file it is the
embedding-failed finding; diagnosed, the engine replays it on /v1/embeddings, measures the
inputs with the server's /tokenize, launches ubatch-raised with -ub/-b past the longest input
and confirms the cause (k/n), batch-split serving the cut inputs too, no other cause
confirmed, the chat-only arms skipped. On a running server given by URL (its -ub unknown,
not relaunchable) the cause stays untested. On 1024-token slots -ub/-b alone meets the context
refusal (HTTP 400, measured), so the arm raises -c with them and still confirms."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Finding, validate_diagnosis
from kb.repo.store import Store
from triage.capture import load_file
from triage.drills import build_drill
from triage.drills.embedding import NAME, SENTENCE, UBATCH
from triage.drills.run import run_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.launcher import running_servers
from triage.stackfile import ServerConfig, Stack, load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _captured(drill: Any, tmp_path: Path, server_binary: Path) -> tuple[Any, list[Finding]]:
    """The failing request sent to the drill's real server, saved and read back as a pair."""
    summary = run_drill(drill, log_dir=tmp_path / "drill-run", binary=server_binary)
    [saved] = summary["failing"]
    document = {
        "request": json.loads(Path(saved["request"]).read_text()),
        "response": json.loads(Path(saved["response"]).read_text()),
        "status": 500,
    }
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(document))
    (exchange,) = load_file(path)
    return exchange, [f.record() for f in classify(exchange)]


def test_an_input_longer_than_ubatch_is_confirmed_by_the_raised_batch(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    exchange, findings = _captured(drill, tmp_path, server_binary)
    refused = [f for f in findings if f.kind == "embedding-failed" and not f.passed]
    assert refused and f"> physical batch {UBATCH})" in refused[0].reason
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(exchange.request, exchange=exchange.to_dict(), findings=tuple(findings)),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["embedding-batch"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == "ubatch-raised"
    base, raised, split = arms["baseline"], arms["ubatch-raised"], arms["batch-split"]
    assert base["failures"] == base["n"] >= 4
    assert raised["failures"] == 0 and raised["n"] >= 4 and raised["ci95"][1] < base["ci95"][0]
    assert split["failures"] == 0 and split["n"] >= 4
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["embedding-batch"]
    observed = {o["name"]: o for o in diagnosis["observations"]}
    inputs = observed["embedding-inputs"]
    assert inputs["longest_tokens"] > UBATCH and inputs["physical_batch"] == UBATCH
    # No chat template is rendered for an embeddings request (it has no messages).
    assert "template-render" not in observed and "determinism" not in observed
    skipped = {s["arm"]: s["reason"] for s in diagnosis["skipped_arms"]}
    assert "/v1/embeddings" in skipped["thinking-off"]
    assert running_servers() == []


def test_a_running_server_by_url_leaves_the_cause_untested(
    server_factory: Any, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    server = server_factory(drill.model, list(drill.server_args))
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("short-and-long")),
            Stack(ServerConfig(url=server.base_url)),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    verdict = causes["embedding-batch"]
    assert verdict["status"] == "suspected"
    assert "ubatch-raised" in verdict["deciding_probe"]
    assert not [c for c, v in causes.items() if v["status"] == "confirmed"]


def test_the_context_is_raised_with_the_batch_when_the_slot_is_smaller(
    server_factory: Any, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    small = [a if a != "16384" else "4096" for a in drill.server_args]  # 4 slots of 1024
    # Measured first: -ub/-b past the input alone is not enough on a 1024-token slot.
    only_batch = [*small, "-ub", "2048", "-b", "2048"]
    server = server_factory(drill.model, only_batch)
    status, body = _post(f"{server.base_url}/v1/embeddings", drill.request("short-and-long"))
    assert status == 400 and "larger than the max context size" in body
    server.stop()
    stack_file = drill.out_dir / "stack.toml"
    stack_file.write_text(stack_file.read_text().replace('"16384"', '"4096"'))
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("short-and-long")),
            load_stack(stack_file),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    assert causes["embedding-batch"]["status"] == "confirmed"
    raised = arms["ubatch-raised"]
    assert "-ub/-b 2048" in raised["variant"] and "-c 8192" in raised["variant"]
    assert raised["failures"] == 0 and raised["n"] >= 4
    assert running_servers() == []


def test_many_inputs_that_each_fit_are_served_whatever_their_total(
    server_factory: Any, tmp_path: Path
) -> None:
    """The limit is per input: 40 inputs of ~200 tokens (8000+ in all) on -ub/-b 256 get 40
    vectors, so the cause is about the longest input, never the request's total."""
    drill = build_drill(NAME, tmp_path / "drill")
    server = server_factory(drill.model, list(drill.server_args))
    body = {"model": NAME, "input": [" ".join([SENTENCE] * 4)] * 40}
    status, text = _post(f"{server.base_url}/v1/embeddings", body)
    assert status == 200 and len(json.loads(text)["data"]) == 40
