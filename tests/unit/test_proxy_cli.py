"""`triage proxy` from the command line: options, refusals with clear messages, a real run
in a child process (forward, record, stop cleanly on Ctrl-C), and the auto-diagnose wiring."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import cast

import httpx
import pytest
from click.testing import CliRunner
from proxy_fakes import FakeUpstream
from sqlmodel import select

from kb.models import LiveExchange, TriageRun
from kb.repo.files import import_paths
from kb.repo.store import Store
from triage.cli import cli
from triage.proxy import serving
from triage.proxy.diagnose import AutoDiagnose, AutoDiagnoseError, check_stack
from triage.proxy.record import OpenedIncident


@pytest.fixture
def upstream() -> Iterator[str]:
    with serving(FakeUpstream()) as server:
        yield server.url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_help_names_the_options() -> None:
    result = CliRunner().invoke(cli, ["proxy", "--help"])
    assert result.exit_code == 0
    for option in (
        "--upstream",
        "--listen",
        "--stack",
        "--sample-successes",
        "--auto-diagnose",
        "--diagnose-upstream",
    ):
        assert option in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "http://127.0.0.1:8080", "--listen", "nowhere"], "--listen must be"),
        (["--upstream", "ftp://x"], "--upstream must be an http(s) URL"),
        (["--upstream", "http://127.0.0.1:8080", "--sample-successes", "2"], "0<=x<=1"),
        (["--upstream", "http://127.0.0.1:8080", "--auto-diagnose"], "--auto-diagnose needs"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["proxy", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_auto_diagnose_never_replays_against_the_upstream_unless_asked(tmp_path: Path) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text('[server]\nurl = "http://localhost:8080"\n')
    result = CliRunner().invoke(
        cli,
        ["proxy", "--upstream", "http://127.0.0.1:8080", "--auto-diagnose", "--stack", str(stack)],
    )
    assert result.exit_code == 2 and "--diagnose-upstream" in result.output
    with pytest.raises(AutoDiagnoseError):
        check_stack(stack, "http://127.0.0.1:8080", allow_upstream=False)
    check_stack(stack, "http://127.0.0.1:8080", allow_upstream=True)
    check_stack(stack, "http://127.0.0.1:9090", allow_upstream=False)  # another server


INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"
EMPTY_REPLY = {
    "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}]
}


def _incident(slug: str) -> OpenedIncident:
    request = {"model": "m", "messages": [{"role": "user", "content": "weather?"}]}
    return cast(
        OpenedIncident,
        {
            "slug": slug,
            "example": {"exchange": {"request": request, "response": EMPTY_REPLY}},
        },
    )


def _kb_with_the_incident(tmp_path: Path) -> str:
    """A knowledge base holding the incident the proxy opened; its URL."""
    db = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(db)
    try:
        import_paths(store, [INCIDENTS])
    finally:
        store.close()
    return db


def test_auto_diagnose_runs_the_engine_on_the_incidents_example_in_a_worker(
    tmp_path: Path,
) -> None:
    # The stack's server does not answer: the engine refuses before recording anything,
    # and the worker says so in its log and exits 1 (the proxy goes on serving).
    stack = tmp_path / "stack.toml"
    stack.write_text(f'[server]\nurl = "http://127.0.0.1:{_free_port()}"\n')
    db = _kb_with_the_incident(tmp_path)
    hook = AutoDiagnose(stack, tmp_path / "runs", database_url=db)
    incident = _incident(REFERENCE)
    hook(incident)
    [worker] = hook.started
    hook.wait(120)
    folder = tmp_path / "runs" / REFERENCE
    assert worker.exitcode == 1
    log_text = (folder / "diagnose.log").read_text()
    assert f"diagnosis of {REFERENCE} not run: $.server.url:" in log_text
    assert "does not answer" in log_text and "Traceback" not in log_text
    example = incident["example"] or {}
    assert json.loads((folder / "request.json").read_text()) == example["exchange"]["request"]
    assert not (folder / "diagnosis.json").exists()
    store = Store(db)
    try:
        with store.session(readonly=True) as session:
            assert session.exec(select(TriageRun)).all() == []  # no run recorded
    finally:
        store.close()


def _stub_server(tmp_path: Path) -> tuple[Path, Path]:
    """A llama-server stand-in that starts and never answers /health; writes its pid."""
    pid_file = tmp_path / "stub.pid"
    stub = tmp_path / "stub-llama-server"
    stub.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--help*|*--version*) exit 0;; esac\n'
        f"echo $$ > {pid_file}\n"
        "exec sleep 600\n"
    )
    stub.chmod(0o755)
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    stack = tmp_path / "stack.toml"
    stack.write_text(f'[server]\nbinary = "{stub}"\nmodel = "w.gguf"\n')
    return stack, pid_file


def _wait_for(path: Path, worker: BaseProcess) -> None:
    for _ in range(1200):  # bounded: the worker starts the stub within seconds
        if path.exists() and path.read_text().strip():
            return
        if wait([worker.sentinel], 0.1):  # the worker ended (its reaper reaps it)
            break
    raise AssertionError("the stub server never started")


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, not yet reaped by its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.parametrize("how", ["proxy-stops", "time-bound"])
def test_a_stopped_auto_diagnosis_stops_its_server(tmp_path: Path, how: str) -> None:
    stack, pid_file = _stub_server(tmp_path)
    db = _kb_with_the_incident(tmp_path)
    hook = AutoDiagnose(stack, tmp_path / "runs", database_url=db)
    hook(_incident(REFERENCE))
    [worker] = hook.started
    try:
        _wait_for(pid_file, worker)
        server_pid = int(pid_file.read_text())
        if how == "proxy-stops":
            hook.stop()
        else:  # the diagnosis is now past its time bound: the hook stops it by itself
            hook.timeout = 0.0
            hook.wait(120)
    finally:
        hook.stop()
    assert worker.exitcode == -signal.SIGTERM
    for _ in range(100):  # the launcher's SIGTERM handler stops the server, then dies
        if _gone(server_pid):
            break
        time.sleep(0.1)
    assert _gone(server_pid), "the worker's server outlived it"


def test_the_command_forwards_records_and_stops_cleanly(upstream: str, tmp_path: Path) -> None:
    port = _free_port()
    db = f"sqlite:///{tmp_path / 'kb.db'}"
    env = {**os.environ, "TRIAGE_DATABASE_URL": db}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "triage.cli",
            "proxy",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            "--spool",
            str(tmp_path / "spool.jsonl"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
                break
            except httpx.ConnectError:
                assert process.poll() is None, "the proxy exited"
                assert time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.2)
        assert health.json() == {"status": "ok"}
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "empty", "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        )
        assert reply.status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 0, output
    store = Store(db, migrate=False)
    try:
        with store.session(readonly=True) as session:
            (row,) = session.exec(select(LiveExchange)).all()
    finally:
        store.close()
    assert row.failed and row.signature == "empty-content|2xx"
