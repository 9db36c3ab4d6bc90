"""Launcher pure parts and process handling, with small stand-in executables.

The real llama-server is exercised in tests/integration/test_llama_launcher.py; here tiny
Python scripts play a server that exits, one that answers 503 before 200, and one that
ignores SIGTERM, to pin down the launcher's own behaviour quickly.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from triage.llama.launcher import (
    ServerSpec,
    ServerStartError,
    free_port,
    launch,
    port_in_use,
    running_servers,
    start,
)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# A minimal HTTP "server": /health answers 503 `loading` times, then 200.
FAKE_SERVER = """
import http.server, os, signal, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
loading = [int(os.environ.get("FAKE_LOADING", "3"))]
if os.environ.get("FAKE_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 503 if loading[0] > 0 else 200
        loading[0] -= 1
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
print("argv", args, "LLAMA_ARG_PORT", os.environ.get("LLAMA_ARG_PORT"), flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_argv_is_a_list_with_loopback_and_port(model: Path):
    spec = ServerSpec(Path("/bin/llama-server"), model, ["-c", "8192", "-np", "4"])
    assert spec.argv(8081) == [
        "/bin/llama-server",
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        "8081",
        "-c",
        "8192",
        "-np",
        "4",
    ]


@pytest.mark.parametrize("flag", ["--port", "--host", "-m", "--model"])
def test_spec_must_not_set_owned_flags(model: Path, flag: str):
    with pytest.raises(ServerStartError, match=flag):
        ServerSpec(Path("/bin/true"), model, [flag, "x"]).argv(1)


def test_free_port_and_port_in_use():
    port = free_port()
    assert 0 < port < 65536 and not port_in_use(port)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        assert port_in_use(holder.getsockname()[1])


def test_missing_model_is_reported_before_starting(tmp_path: Path):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    with pytest.raises(ServerStartError, match="model file not found: .*nope.gguf"):
        start(ServerSpec(binary, tmp_path / "nope.gguf"), tmp_path)
    assert running_servers() == []


def test_missing_binary(tmp_path: Path, model: Path):
    with pytest.raises(ServerStartError, match="binary not found"):
        start(ServerSpec(tmp_path / "no-such-server", model), tmp_path)


def test_occupied_port_is_reported(tmp_path: Path, model: Path):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            start(ServerSpec(binary, model), tmp_path, port=port)


def test_exit_during_startup_reports_code_and_log_tail(tmp_path: Path, model: Path):
    binary = script(
        tmp_path,
        "srv",
        """
        import sys
        print("loading model ...")
        print("error: failed to load model", file=sys.stderr)
        sys.exit(3)
    """,
    )
    with pytest.raises(ServerStartError) as info:
        start(ServerSpec(binary, model), tmp_path / "logs", ready_timeout=10)
    message = str(info.value)
    assert "exited with code 3" in message
    assert "error: failed to load model" in message
    assert running_servers() == []


def test_waits_through_503_and_stops_cleanly(tmp_path: Path, model: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOADING", "3")
    monkeypatch.setenv("LLAMA_ARG_PORT", "1")  # must not leak into the child
    binary = script(tmp_path, "srv", FAKE_SERVER + "\n")
    with launch(ServerSpec(binary, model, ["-c", "64"]), tmp_path / "logs") as server:
        assert server.alive() and server.launch_seconds is not None
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert "--metrics" in server.argv
        assert server in running_servers()
        pid = server.pid
    assert not server.alive()
    assert running_servers() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "LLAMA_ARG_PORT None" in server.log_tail()


def test_health_timeout(tmp_path: Path, model: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOADING", "100000")
    binary = script(tmp_path, "srv", FAKE_SERVER)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"not healthy within 1s \(last /health: HTTP 503\)"):
        start(ServerSpec(binary, model), tmp_path, ready_timeout=1)
    assert time.monotonic() - started < 15
    assert running_servers() == []


def test_stop_escalates_to_sigkill(tmp_path: Path, model: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOADING", "0")
    monkeypatch.setenv("FAKE_IGNORE_TERM", "1")
    binary = script(tmp_path, "srv", FAKE_SERVER)
    server = start(ServerSpec(binary, model), tmp_path)
    started = time.monotonic()
    code = server.stop(grace=0.5)
    assert code == -9
    assert time.monotonic() - started < 5


def test_context_manager_stops_on_keyboard_interrupt(tmp_path: Path, model: Path, monkeypatch):
    monkeypatch.setenv("FAKE_LOADING", "0")
    binary = script(tmp_path, "srv", FAKE_SERVER)
    with pytest.raises(KeyboardInterrupt):
        with launch(ServerSpec(binary, model), tmp_path) as server:
            raise KeyboardInterrupt
    assert not server.alive() and running_servers() == []
