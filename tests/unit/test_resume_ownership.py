"""Issue 28 item 1: a run belongs to one incident and one stack. `--resume` continues the
caller's own interrupted run (same stack, and request / incident when given), never a run
that a live process still runs, and refuses to guess between incidents."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlmodel import select

from kb.domain.diagnosis import Diagnosis
from kb.models import Incident, TriageRun
from kb.repo import runs
from kb.repo.store import Store
from triage.cli import cli
from triage.engine import EngineError, run_to_resume
from triage.engine.resuming import (
    FINGERPRINTS,
    STACK_LABEL,
    request_fingerprint,
    stack_fingerprint,
    stack_label,
)
from triage.stackfile import Stack, parse_stack

GEMMA_REQ = {"messages": [{"role": "user", "content": "gemma question"}], "max_tokens": 64}
SMOL_REQ = {"messages": [{"role": "user", "content": "smol question"}], "max_tokens": 64}


def _stack(tmp_path: Path, model: str, *args: str) -> Stack:
    (tmp_path / model).write_bytes(b"GGUF")
    quoted = ", ".join(f'"{a}"' for a in args)
    return parse_stack(
        f'[server]\nmodel = "{model}"\nargs = [{quoted}]\n', base=tmp_path, source="stack.toml"
    )


def _dead_owner() -> runs.RunOwner:
    """The owner of a run whose process was killed: a pid that no longer exists."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return runs.RunOwner(proc.pid, runs.RunOwner.current().host, None)


def _run(
    store: Store,
    model: str,
    stack: Stack,
    request: dict,  # type: ignore[type-arg]
    *,
    state: str,
    owner: runs.RunOwner,
) -> tuple[str, int]:
    plan = {
        "request": request,
        STACK_LABEL: stack_label(stack),
        FINGERPRINTS: {
            "stack": stack_fingerprint(stack),
            "request": request_fingerprint(request),
        },
    }
    with store.session() as session:
        incident = runs.new_incident(session, runs.NewIncident(model=model, kinds=["length-stop"]))
        assert incident.id is not None
        run_id = runs.start_run(session, incident.id, plan, owner)
        runs.set_run_state(session, run_id, state)
        # set_run_state keeps the owner: the state is what the process left behind.
        return incident.slug, run_id


def _states(store: Store) -> dict[int, str]:
    with store.session(readonly=True) as session:
        return {int(r.id or 0): r.state for r in session.exec(select(TriageRun))}


def test_resume_without_incident_picks_the_run_of_this_stack_not_a_running_one(
    store: Store, tmp_path: Path
) -> None:
    gemma = _stack(tmp_path, "gemma-3-270m-it.gguf", "-c", "2048")
    smol = _stack(tmp_path, "SmolLM2-135M-Instruct.gguf", "-c", "2048")
    # Gemma's run is still running in another terminal (a live owner: this process).
    gemma_slug, gemma_run = _run(
        store, "gemma", gemma, GEMMA_REQ, state="running", owner=runs.RunOwner.current()
    )
    # SmolLM2's run was interrupted (Ctrl-C) -- it is newer than nothing, older than none.
    smol_slug, smol_run = _run(
        store, "smol", smol, SMOL_REQ, state="interrupted", owner=_dead_owner()
    )
    assert gemma_run < smol_run
    chosen = run_to_resume(store, smol)
    assert chosen.id == smol_run
    # Gemma's stack: its run is running, so nothing is resumed and it is left alone.
    with pytest.raises(EngineError) as refused:
        run_to_resume(store, gemma)
    text = str(refused.value)
    assert "nothing to resume" in text and "still running" in text
    assert f"run {gemma_run}  {gemma_slug}" in text and "pid" in text
    assert _states(store)[gemma_run] == "running"


def test_a_run_left_running_by_a_killed_process_is_interrupted_and_resumable(
    store: Store, tmp_path: Path
) -> None:
    smol = _stack(tmp_path, "SmolLM2-135M-Instruct.gguf")
    _, run_id = _run(store, "smol", smol, SMOL_REQ, state="running", owner=_dead_owner())
    assert run_to_resume(store, smol).id == run_id
    assert _states(store)[run_id] == "interrupted"  # `triage show` no longer says running


def test_resume_refuses_to_guess_between_incidents_of_the_same_stack(
    store: Store, tmp_path: Path
) -> None:
    stack = _stack(tmp_path, "SmolLM2-135M-Instruct.gguf", "-c", "2048")
    first, _ = _run(store, "smol", stack, SMOL_REQ, state="interrupted", owner=_dead_owner())
    other_req = {"messages": [{"role": "user", "content": "another"}], "max_tokens": 8}
    second, second_run = _run(
        store, "smol", stack, other_req, state="interrupted", owner=_dead_owner()
    )
    with pytest.raises(EngineError) as refused:
        run_to_resume(store, stack)
    text = str(refused.value)
    assert "--incident" in text and first in text and second in text
    assert "SmolLM2-135M-Instruct.gguf -c 2048" in text  # the stack of each run, listed
    # Naming the incident, or giving the request, decides.
    assert run_to_resume(store, stack, incident=second).id == second_run
    assert run_to_resume(store, stack, request=other_req).id == second_run


def test_a_live_run_is_never_claimed(store: Store, tmp_path: Path) -> None:
    stack = _stack(tmp_path, "m.gguf")
    other = runs.RunOwner(1, runs.RunOwner.current().host, runs._process_started(1))
    _, run_id = _run(store, "m", stack, SMOL_REQ, state="running", owner=other)
    with store.session() as session, pytest.raises(runs.RunBusy, match="still running"):
        runs.claim_run(session, run_id)
    assert _states(store)[run_id] == "running"


def _cli(store: Store, tmp_path: Path, *args: str) -> Result:
    env = {"TRIAGE_DATABASE_URL": store.url, "TRIAGE_HOME": str(tmp_path / "home")}
    return CliRunner().invoke(cli, list(args), env=env)


def test_cli_resume_lists_the_runs_and_shows_the_stack(store: Store, tmp_path: Path) -> None:
    stack_path = tmp_path / "stack.toml"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    stack_path.write_text('[server]\nmodel = "m.gguf"\nargs = ["--api-key", "sk-secret-123"]\n')
    other = _stack(tmp_path, "other.gguf")
    slug, run_id = _run(store, "other", other, SMOL_REQ, state="interrupted", owner=_dead_owner())
    result = _cli(store, tmp_path, "diagnose", "--resume", "--stack", str(stack_path))
    assert result.exit_code != 0
    assert "nothing to resume" in result.output and "m.gguf" in result.output
    assert f"run {run_id}  {slug}" in result.output and "other.gguf" in result.output
    assert "sk-secret-123" not in result.output and "Traceback" not in result.output
    with store.session(readonly=True) as session:
        assert session.exec(select(Incident)).one().slug == slug


def test_show_names_the_stack_of_the_incidents_run(store: Store, tmp_path: Path) -> None:
    stack = _stack(tmp_path, "SmolLM2-135M-Instruct.gguf", "-c", "2048", "--api-key", "sk-x-1234")
    slug, _ = _run(store, "smol", stack, SMOL_REQ, state="interrupted", owner=_dead_owner())
    shown = _cli(store, tmp_path, "show", slug)
    assert shown.exit_code != 0
    assert "latest run is interrupted" in shown.output
    assert "stack: SmolLM2-135M-Instruct.gguf -c 2048 --api-key" in shown.output
    assert "sk-x-1234" not in shown.output


def test_a_diagnosis_prints_the_stack_it_ran_on() -> None:
    from triage.commands.engine import format_diagnosis

    text = format_diagnosis(
        Diagnosis.from_json(
            {
                "incident": "2026-12-01-smol-length-stop",
                "run_id": 3,
                "stack": {
                    "server": {"model": "/m/SmolLM2.gguf", "args": ["-c", "2048"], "url": None}
                },
            }
        )
    )
    assert text.splitlines()[1] == "stack: SmolLM2.gguf -c 2048"
    url = format_diagnosis(
        Diagnosis.from_json(
            {"incident": "x", "run_id": 1, "stack": {"server": {"url": "http://h:1"}}}
        )
    )
    assert "stack: running server at http://h:1" in url


def test_ctrl_c_says_whether_a_run_was_recorded(store: Store, tmp_path: Path) -> None:
    from triage.commands.engine import _interrupted_message

    # Before the run row (the incident's server still starting): nothing to resume.
    assert _interrupted_message(store) == (
        "interrupted before the run started: nothing was recorded, nothing to resume"
    )
    # After it: the run this process left interrupted, and how to continue it.
    stack = _stack(tmp_path, "m.gguf")
    slug, run_id = _run(
        store, "m", stack, SMOL_REQ, state="interrupted", owner=runs.RunOwner.current()
    )
    message = _interrupted_message(store)
    assert f"run {run_id} of {slug} is recorded as interrupted" in message
    assert "triage diagnose --resume" in message
