"""The context drills diagnosed on a real llama-server: context-size confirmed (k/n with an
interval, the larger-context arm removing the failure) for both the reply cut at the context
end and the prompt the server refuses; context-shift confirmed on the request that never
ends; in each, no other cause confirmed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import exchange_from_http
from triage.drills import Drill, build_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _diagnose(
    drill: Drill, folder: Path, request: dict[str, Any], timeout: float = 180.0, **capture: Any
) -> Any:
    store = Store(f"sqlite:///{folder / 'kb.db'}")
    return diagnose(
        store,
        Intake(request, **capture),
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=16, log_dir=folder / "runs", request_timeout=timeout),
    ).to_json()


@pytest.fixture(scope="module")
def drill(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Drill:
    return build_drill("context-size", tmp_path_factory.mktemp("ctx") / "drill")


@pytest.fixture(scope="module")
def cut_reply(drill: Drill, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The greedy request: every reply stops at the 256-token slot end."""
    return _diagnose(drill, tmp_path_factory.mktemp("cut"), drill.request("greedy"))


@pytest.fixture(scope="module")
def refused(drill: Drill, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The long prompt, captured as the server's HTTP 400 refusal."""
    request = drill.request("long-prompt")
    body = {
        "error": {
            "code": 400,
            "message": "request (577 tokens) exceeds the available context size (256 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 577,
            "n_ctx": 256,
        }
    }
    exchange = exchange_from_http(request, body, status=400)
    findings = tuple(f.record() for f in classify(exchange))
    return _diagnose(
        drill,
        tmp_path_factory.mktemp("refused"),
        request,
        exchange=exchange.to_dict(),
        findings=findings,
    )


def _causes(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in diagnosis["causes"]}


def _arms(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in diagnosis["arms"]}


def _observation(diagnosis: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in diagnosis["observations"] if o["name"] == name)


def _assert_confirmed_alone(diagnosis: dict[str, Any], drill: Drill, cause: str) -> None:
    validate_diagnosis(diagnosis)
    causes = _causes(diagnosis)
    for cause_id, truth in drill.manifest["causes"].items():
        assert causes[cause_id]["status"] in truth["accept"], (cause_id, causes[cause_id])
    confirmed = [c for c in causes if causes[c]["status"] == "confirmed"]
    assert confirmed == [cause]
    assert running_servers() == []


def test_reply_cut_at_the_context_end_confirms_context_size(
    cut_reply: dict[str, Any], drill: Drill
) -> None:
    _assert_confirmed_alone(cut_reply, drill, "context-size")
    arms = _arms(cut_reply)
    baseline, larger = arms["baseline"], arms["context-lifted"]
    assert baseline["failures"] == baseline["n"] >= 4  # deterministic at temperature 0
    assert larger["decision"] == "removes"
    assert larger["failures"] == 0 and larger["n"] >= 4 and larger["p_value"] < 0.05
    assert larger["ci95"][1] < baseline["ci95"][0]
    # Raising max_tokens does nothing: the context, not the limit, cuts the reply.
    # (max_tokens 1024 reaches past the 256-token slot: lifting it is not even planned.)
    skipped = {s["arm"]: s["reason"] for s in cut_reply["skipped_arms"]}
    assert "token-limit-lifted" not in arms and "max_tokens below" in skipped["token-limit-lifted"]
    assert _causes(cut_reply)["token-limit"]["status"] == "rejected"
    rationale = _causes(cut_reply)["context-size"]["rationale"]
    assert f"0/{larger['n']}" in rationale and "95% CI" in rationale


def test_context_fill_observation_shows_the_slot_was_full(cut_reply: dict[str, Any]) -> None:
    fill = _observation(cut_reply, "context-fill")
    slot = fill["n_ctx_slot"]
    assert slot == 256  # -c 1024 over -np 4
    assert fill["finish_reason"] == "length" and fill["reached_context"] is True
    assert fill["tokens_used"] >= slot - 2 and fill["completion_tokens"] < fill["max_tokens"]
    assert fill["arm"]["n_ctx_slot"] > slot  # lifted to what the reply can need
    assert (
        fill["arm"]["finish_reason"] == "stop"
        and fill["arm"]["tokens_used"] < fill["arm"]["n_ctx_slot"]
    )
    assert (
        f"used {fill['tokens_used']} of the slot's {slot}"
        in (_causes(cut_reply)["context-size"]["rationale"])
    )


def test_context_shift_is_rejected_on_the_context_size_drill(cut_reply: dict[str, Any]) -> None:
    shift = _causes(cut_reply)["context-shift"]
    assert shift["status"] == "rejected"
    assert {"context-shift-off", "max-tokens-set"}.isdisjoint(_arms(cut_reply))


def test_prompt_refused_for_its_size_confirms_context_size(
    refused: dict[str, Any], drill: Drill
) -> None:
    assert refused["reproduction"]["signature"]["status_class"] == "4xx"
    _assert_confirmed_alone(refused, drill, "context-size")
    arms = _arms(refused)
    assert arms["baseline"]["failures"] == arms["baseline"]["n"] >= 4
    assert (
        arms["context-lifted"]["decision"] == "removes" and arms["context-lifted"]["failures"] == 0
    )
    fill = _observation(refused, "context-fill")
    assert fill["exceeded"] is True and fill["status"] == 400
    assert fill["prompt_tokens"] > fill["n_ctx_slot"] == 256
    assert fill["arm"]["finish_reason"] == "stop"
    assert "refused the prompt" in _causes(refused)["context-size"]["rationale"]


@pytest.fixture(scope="module")
def shift_drill(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Drill:
    return build_drill("context-shift", tmp_path_factory.mktemp("shift") / "drill")


@pytest.fixture(scope="module")
def never_ends(shift_drill: Drill) -> dict[str, Any]:
    """The context-shift drill: no max_tokens, --context-shift, a loop; every replay hangs."""
    return _diagnose(
        shift_drill,
        shift_drill.out_dir.parent,
        shift_drill.request("unbounded"),
        timeout=shift_drill.manifest["replay_timeout"],
    )


def test_request_that_never_ends_under_context_shift_confirms_context_shift(
    never_ends: dict[str, Any], shift_drill: Drill
) -> None:
    _assert_confirmed_alone(never_ends, shift_drill, "context-shift")
    arms = _arms(never_ends)
    baseline, off = arms["baseline"], arms["context-shift-off"]
    assert baseline["failures"] == baseline["n"] >= 4  # every replay hangs
    assert off["decision"] == "removes" and off["failures"] == 0 and off["n"] >= 4
    assert off["ci95"][1] < baseline["ci95"][0] and off["p_value"] < 0.05
    hang = _observation(never_ends, "server-hang")
    assert hang["phase"] == "hang"
    # A larger context does not help a generation that never ends.
    assert arms["context-lifted"]["decision"] == "unchanged"
    assert _causes(never_ends)["context-size"]["status"] == "rejected"
    rationale = _causes(never_ends)["context-shift"]["rationale"]
    assert "--no-context-shift" in rationale and f"0/{off['n']}" in rationale
