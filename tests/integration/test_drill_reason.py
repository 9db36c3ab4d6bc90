"""structured-output and reasoning-leak on their drills, diagnosed on the real llama-server.

One diagnosis per drill (module-scoped); verdicts are checked against each drill's manifest
and the deciding arms' k/n with their intervals, never against numbers of one run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.model_lint import LINT_KINDS
from triage.stackfile import load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

OWN = ("structured-output", "reasoning-leak")


def _diagnose(
    name: str, folder: Path, *, request_format: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    drill = build_drill(name, folder / "drill")
    stack = load_stack(drill.out_dir / "stack.toml")
    request = drill.request("greedy")
    if request_format is not None:
        # The same leak caused by the request instead: a server with the default format,
        # a client that sends reasoning_format itself.
        args = list(stack.server.args)
        at = args.index("--reasoning-format")
        del args[at : at + 2]
        stack = replace(stack, server=stack.server.with_args(args))
        request = {**request, "reasoning_format": request_format}
    store = Store(f"sqlite:///{folder / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(request),
            stack,
            options=DiagnoseOptions(max_requests=16, log_dir=folder / "runs"),
        ).to_json()
    finally:
        store.close()
    return diagnosis, drill.manifest


@pytest.fixture(scope="module")
def structured(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    yield _diagnose("qwen35-structured-output", tmp_path_factory.mktemp("structured"))


@pytest.fixture(scope="module")
def leak(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    yield _diagnose("gemma4-reasoning-leak", tmp_path_factory.mktemp("leak"))


@pytest.fixture(scope="module")
def leak_by_request(
    server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("leak-request")
    yield _diagnose("gemma4-reasoning-leak", folder, request_format="none")


def _causes(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in diagnosis["causes"]}


def _arms(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in diagnosis["arms"]}


def _assert_removes(arm: dict[str, Any], baseline: dict[str, Any]) -> None:
    assert arm["decision"] == "removes", arm
    assert arm["failures"] == 0 and arm["n"] >= 4 and arm["p_value"] < 0.05
    assert arm["ci95"][1] < baseline["ci95"][0]  # intervals apart


def _assert_only(diagnosis: dict[str, Any], manifest: dict[str, Any], cause: str) -> None:
    validate_diagnosis(diagnosis)
    causes = _causes(diagnosis)
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == [cause], {c: causes[c]["rationale"] for c in confirmed}
    for cause_id, truth in manifest["causes"].items():
        assert causes[cause_id]["status"] in truth["accept"], (cause_id, causes[cause_id])


def test_structured_output_confirmed_on_its_drill_and_nothing_else(
    structured: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    diagnosis, manifest = structured
    _assert_only(diagnosis, manifest, "structured-output")
    arms = _arms(diagnosis)
    baseline = arms["baseline"]
    assert baseline["failures"] == baseline["n"] >= 4  # deterministic at temperature 0
    _assert_removes(arms["no-structured-output"], baseline)
    _assert_removes(arms["thinking-off"], baseline)
    # More tokens do not help: the reply stops, it is not cut.
    assert arms["token-limit-lifted"]["decision"] != "removes"
    verdict = _causes(diagnosis)["structured-output"]
    assert f"{baseline['failures']}/{baseline['n']} (95% CI" in verdict["rationale"]
    kinds = {f["kind"] for f in diagnosis["findings"] if not f.get("passed", True)}
    # Diagnosed from a request alone: no exchange findings, only the model-file lint's.
    captured = [f for f in diagnosis["findings"] if f["kind"] not in LINT_KINDS]
    assert "structured-output-failed" in kinds or not captured
    assert _causes(diagnosis)["reasoning-leak"]["status"] == "rejected"


def test_reasoning_leak_confirmed_on_its_drill_and_nothing_else(
    leak: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    diagnosis, manifest = leak
    _assert_only(diagnosis, manifest, "reasoning-leak")
    arms = _arms(diagnosis)
    baseline = arms["baseline"]
    assert baseline["failures"] == baseline["n"] >= 4
    _assert_removes(arms["server-reasoning-format"], baseline)
    assert "no-structured-output" not in arms  # planned only for constrained requests
    verdict = _causes(diagnosis)["reasoning-leak"]
    assert verdict["status"] == "confirmed"
    assert "server-reasoning-format" in verdict["rationale"]
    assert f"{baseline['failures']}/{baseline['n']} (95% CI" in verdict["rationale"]
    assert _causes(diagnosis)["structured-output"]["status"] == "rejected"


def test_reasoning_leak_from_the_request_is_told_apart_from_the_server(
    leak_by_request: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    diagnosis, manifest = leak_by_request
    _assert_only(diagnosis, manifest, "reasoning-leak")
    arms = _arms(diagnosis)
    assert "server-reasoning-format" not in arms  # the server's own format does not leak
    _assert_removes(arms["request-reasoning-format"], arms["baseline"])
    assert "the request's reasoning_format" in _causes(diagnosis)["reasoning-leak"]["rationale"]


def test_no_server_left_running(
    structured: tuple[dict[str, Any], dict[str, Any]],
    leak: tuple[dict[str, Any], dict[str, Any]],
    leak_by_request: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []
