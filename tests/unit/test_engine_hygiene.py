"""Engine hygiene without a llama-server: what is refused before anything launches or is
recorded, monotone evidence, `show` after a failed run, abandoned runs."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func
from sqlmodel import select

from kb.models import Cause, Incident, TriageRun, utcnow
from kb.repo import runs
from kb.repo.store import Store, add_evidence
from triage.cli import cli
from triage.engine import EngineError, Intake, diagnose, unfinished_run
from triage.stackfile import parse_stack

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def _stack(tmp_path: Path, server: str, extra: str = ""):  # type: ignore[no-untyped-def]
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    return parse_stack(f"[server]\n{server}\n{extra}", base=tmp_path, source="stack.toml")


def _incidents(store: Store) -> int:
    with store.session(readonly=True) as session:
        return int(session.exec(select(func.count()).select_from(Incident)).one())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_request_without_messages_is_refused_before_anything_is_recorded(
    store: Store, tmp_path: Path
) -> None:
    stack = _stack(tmp_path, 'model = "w.gguf"')
    with pytest.raises(EngineError, match=r"\$\.messages is required"):
        diagnose(store, Intake({"model": "m", "prompt": "hi"}), stack)
    assert _incidents(store) == 0


def test_a_dead_url_is_refused_before_anything_is_recorded(store: Store, tmp_path: Path) -> None:
    stack = _stack(tmp_path, f'url = "http://127.0.0.1:{_free_port()}"')
    with pytest.raises(EngineError, match=r"\$\.server\.url: .* does not answer"):
        diagnose(store, Intake(REQUEST), stack)
    assert _incidents(store) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        ('["--port", "8080"]', "must not set --port"),
        ('["--host=0.0.0.0"]', "must not set --host"),
        ('["-md", "missing-draft.gguf"]', "-md file not found"),
    ],
)
def test_argument_problems_are_refused_before_launching(
    store: Store, tmp_path: Path, args: str, message: str
) -> None:
    stack = _stack(tmp_path, f'model = "w.gguf"\nargs = {args}')
    with pytest.raises(EngineError, match=message):
        diagnose(store, Intake(REQUEST), stack)
    assert _incidents(store) == 0


def test_an_unknown_incident_slug_is_refused(store: Store, tmp_path: Path) -> None:
    stack = _stack(tmp_path, 'model = "w.gguf"')
    with pytest.raises(EngineError, match="no such incident"):
        diagnose(store, Intake(REQUEST), stack, incident="2026-01-01-typo")
    assert _incidents(store) == 0


def _incident_with_cause(store: Store) -> int:
    with store.session() as session:
        incident = runs.new_incident(session, runs.NewIncident(model="m", kinds=["length-stop"]))
        assert incident.id is not None
        runs.ensure_causes(
            session, incident.id, [runs.CauseSpec("quantized-weights", "w")], "engine"
        )
        add_evidence(
            session, incident_id=incident.id, kind="measurement", summary="alt 8/8", key="E1"
        )
        return incident.id


def _apply(
    store: Store, incident_id: int, status: str, basis: str, refutes: list[str]
) -> dict[str, dict[str, object]]:
    with store.session() as session:
        run_id = runs.start_run(session, incident_id, {"request": REQUEST})
        verdict = runs.VerdictRow(
            "quantized-weights", status, f"{status} ({basis})", [], refutes, "alt-weights", basis
        )
        return runs.apply_verdicts(session, incident_id, run_id, [verdict], "engine")


def _cause(store: Store) -> Cause:
    with store.session(readonly=True) as session:
        return session.exec(select(Cause).where(Cause.key == "quantized-weights")).one()


def test_not_testable_never_overwrites_a_measured_verdict(store: Store) -> None:
    incident_id = _incident_with_cause(store)
    _apply(store, incident_id, "rejected", "measured", ["E1"])
    assert _cause(store).status == "rejected"
    # A later, weaker run (no alternates: "not testable") leaves it rejected.
    changes = _apply(store, incident_id, "suspected", "untested", [])
    assert changes["quantized-weights"]["applied"] is False
    cause = _cause(store)
    assert cause.status == "rejected" and cause.basis == "measured"
    # An undecided measurement is weaker than a decided one, too.
    _apply(store, incident_id, "suspected", "measured", [])
    assert _cause(store).status == "rejected"
    # Equally strong evidence moves it.
    _apply(store, incident_id, "confirmed", "measured", [])
    assert _cause(store).status == "confirmed"


def _cli(store: Store, tmp_path: Path, *args: str) -> Result:
    env = {"TRIAGE_DATABASE_URL": store.url, "TRIAGE_HOME": str(tmp_path / "home")}
    return CliRunner().invoke(cli, list(args), env=env)


def test_show_after_a_failed_run_says_so_and_exits_non_zero(store: Store, tmp_path: Path) -> None:
    incident_id = _incident_with_cause(store)
    with store.session() as session:
        run_id = runs.start_run(session, incident_id, {"request": REQUEST})
        runs.set_run_state(session, run_id, "failed", finished=True)
        slug = session.get(Incident, incident_id).slug  # type: ignore[union-attr]
    for args in ([], ["--json"]):
        result = _cli(store, tmp_path, "show", slug, *args)
        assert result.exit_code != 0
        assert "latest run is failed" in result.output
        assert "{}" not in result.output and "Traceback" not in result.output
    missing = _cli(store, tmp_path, "show", "2026-01-01-nope", "--json")
    assert missing.exit_code != 0 and "no incident" in missing.output


def test_show_prints_the_latest_recorded_diagnosis(store: Store, tmp_path: Path) -> None:
    incident_id = _incident_with_cause(store)
    with store.session() as session:
        slug = session.get(Incident, incident_id).slug  # type: ignore[union-attr]
        done = runs.start_run(session, incident_id, {"request": REQUEST})
        result = {
            "schema_version": 1,
            "incident": slug,
            "run_id": done,
            "findings": [],
            "arms": [],
            "causes": [],
            "graph": {"nodes": 0, "edges": 0},
        }
        runs.finish_run(session, done, "done", result)
        later = runs.start_run(session, incident_id, {"request": REQUEST})
        runs.set_run_state(session, later, "failed", finished=True)
    shown = _cli(store, tmp_path, "show", slug, "--json")
    assert shown.exit_code == 0 and json.loads(shown.output)["run_id"] == done


def test_an_abandoned_run_is_marked_interrupted_and_can_be_resumed(store: Store) -> None:
    incident_id = _incident_with_cause(store)
    with store.session() as session:
        run_id = runs.start_run(session, incident_id, {"request": REQUEST})
        run = session.get(TriageRun, run_id)
        assert run is not None
        old = (utcnow() - timedelta(hours=2)).isoformat()
        run.plan = {**run.plan, runs.HEARTBEAT: old}
        session.add(run)
        fresh = runs.start_run(session, incident_id, {"request": REQUEST})
    # The fresh run is still running (its owner, this process, is alive): never resumed.
    found = unfinished_run(store, None)
    assert found is not None and found.id == run_id
    with store.session(readonly=True) as session:
        states = {r.id: r.state for r in session.exec(select(TriageRun))}
    assert states[run_id] == "interrupted" and states[fresh] == "running"


def test_no_server_binary_is_a_clear_error_before_anything_is_recorded(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(tmp_path / "no-such-llama-server"))
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    stack = _stack(tmp_path, 'model = "w.gguf"')
    with pytest.raises(EngineError, match=r"\$\.server: .*llama-server"):
        diagnose(store, Intake(REQUEST), stack)
    assert _incidents(store) == 0
