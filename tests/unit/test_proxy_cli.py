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
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from proxy_fakes import FakeUpstream
from sqlmodel import select

from kb.models import LiveExchange
from kb.repo.store import Store
from triage.cli import cli
from triage.proxy import serving
from triage.proxy.diagnose import AutoDiagnose, AutoDiagnoseError, check_stack


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


def test_auto_diagnose_starts_triage_diagnose_on_the_incidents_example(tmp_path: Path) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text('[server]\nmodel = "m.gguf"\n')
    argv_file = tmp_path / "argv.json"
    recorder = [
        sys.executable,
        "-c",
        f"import json, sys; json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))",
    ]
    hook = AutoDiagnose(stack, tmp_path / "runs", database_url="sqlite:///kb.db", command=recorder)
    request = {"model": "m", "messages": [{"role": "user", "content": "weather?"}]}
    hook(
        {
            "slug": "2026-12-01-live-m-empty",
            "example": {"exchange": {"request": request, "response": {"choices": []}}},
        }
    )
    hook.started[0].wait(30)
    hook.stop()
    argv = json.loads(argv_file.read_text())
    assert argv[:3] == ["--database", "sqlite:///kb.db", "diagnose"]
    assert argv[argv.index("--stack") + 1] == str(stack)
    assert argv[argv.index("--incident") + 1] == "2026-12-01-live-m-empty"
    assert json.loads(Path(argv[argv.index("--request") + 1]).read_text()) == request


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
