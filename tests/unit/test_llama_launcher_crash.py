"""Launcher errors carry a CrashReport: startup crash, hang at startup, crash mid-request and
a request that never answers -- with small stand-in executables (the real llama-server runs
in tests/integration/test_llama_crash_real.py). Every process is gone afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from triage.drills.standin import write_amx_crash_standin
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.launcher import (
    ServerCrashed,
    ServerHung,
    ServerSpec,
    ServerStartError,
    running_servers,
    start,
)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# Healthy at once; POST requests (chat) never answer when FAKE_HANG is set.
FAKE_SERVER = """
import http.server, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
print("argv", args, flush=True)
print("system_info: n_threads = 1 / 2 | CPU : AVX2 = 1 | REPACK = 1 |", flush=True)
print("main: server is listening on http://127.0.0.1:%d" % port, flush=True)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        time.sleep(3600)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_amx_standin_crash_at_startup_raises_with_report(tmp_path: Path, model: Path):
    standin = write_amx_crash_standin(Path("/bin/false"), tmp_path / "llama-server")
    with pytest.raises(ServerStartError) as info:
        start(ServerSpec(standin, model, ["-t", "1"]), tmp_path / "logs", ready_timeout=20)
    report = info.value.report
    assert report is not None and report.phase == "startup"
    assert report.exit_code == -11 and report.signal == "SIGSEGV"
    assert report.backtrace_symbol == "ggml_backend_amx_mul_mat"
    assert report.amx_build and report.repack and report.amx_suspected
    assert report.log_path and Path(report.log_path).is_file()
    message = str(info.value)
    assert "exited with code -11 during startup" in message  # the old wording still holds
    assert "crashed with SIGSEGV" in message and "--no-repack" in message
    assert "warming up the model" in info.value.log_tail
    assert running_servers() == []


def test_amx_standin_runs_the_real_binary_with_no_repack(tmp_path: Path, model: Path):
    real = script(
        tmp_path,
        "real",
        """
        import sys
        print("REAL", sys.argv[1:], flush=True)
        sys.exit(7)
    """,
    )
    standin = write_amx_crash_standin(real, tmp_path / "llama-server")
    with pytest.raises(ServerStartError) as info:
        start(ServerSpec(standin, model, ["--no-repack"]), tmp_path / "logs", ready_timeout=20)
    assert info.value.report is not None and info.value.report.exit_code == 7
    assert info.value.report.signal is None
    assert "REAL [" in info.value.log_tail and "'--no-repack'" in info.value.log_tail


def test_launcher_asks_for_trace_verbosity_unless_the_spec_sets_one(tmp_path: Path, model: Path):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    server = start(ServerSpec(binary, model), tmp_path / "a")
    try:
        assert server.argv[-2:] == ["-lv", "4"]
    finally:
        server.stop()
    server = start(ServerSpec(binary, model, ["-lv", "2"]), tmp_path / "b")
    try:
        assert server.argv.count("-lv") == 1 and "2" in server.argv
    finally:
        server.stop()


def test_hang_at_startup_reports_phase_hang(tmp_path: Path, model: Path):
    binary = script(
        tmp_path,
        "srv",
        """
        import time
        print("main: loading model", flush=True)
        time.sleep(3600)
    """,
    )
    with pytest.raises(ServerStartError) as info:
        start(ServerSpec(binary, model), tmp_path / "logs", ready_timeout=1)
    report = info.value.report
    assert report is not None and report.phase == "hang" and report.exit_code is None
    assert "no healthy /health within 1s" in report.detail
    assert report.sentence().startswith("llama-server hung (model load)")
    assert running_servers() == []


def test_crash_mid_request_is_explained_by_the_server(tmp_path: Path, model: Path):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    server = start(ServerSpec(binary, model), tmp_path / "logs")
    try:
        os.kill(server.pid, signal.SIGSEGV)
        server.process.wait(timeout=10)
        with pytest.raises(ServerCrashed) as info:
            server.check()
        report = info.value.report
        assert report is not None and report.phase == "mid-request"
        assert report.signal == "SIGSEGV" and report.cpu_features == {"AVX2": "1", "REPACK": "1"}
        assert "crashed with SIGSEGV in the middle of a request (serving)" in str(info.value)
        explained = server.explain(LlamaClientError("dropped", kind="disconnected", url="u"))
        assert isinstance(explained, ServerCrashed) and not isinstance(explained, ServerHung)
    finally:
        server.stop()


def test_request_that_never_answers_makes_a_hang_report_and_stops_the_server(
    tmp_path: Path, model: Path
):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    server = start(ServerSpec(binary, model), tmp_path / "logs")
    pid = server.pid

    async def ask() -> None:
        async with LlamaClient(server.base_url, timeout=1) as client:
            await client.chat({"messages": [{"role": "user", "content": "hi"}]})

    try:
        with pytest.raises(LlamaClientError) as failed:
            asyncio.run(ask())
        assert failed.value.kind == "timeout"
        hung = server.explain(failed.value)
        assert isinstance(hung, ServerHung)
        assert hung.report is not None and hung.report.phase == "hang"
        assert hung.report.exit_code is None  # it was still running when we gave up
        assert "no complete answer" in hung.report.detail
        assert not server.alive() and _gone(pid)
        assert running_servers() == []
    finally:
        server.stop()


def test_healthy_server_does_not_explain_a_client_error(tmp_path: Path, model: Path):
    binary = script(tmp_path, "srv", FAKE_SERVER)
    server = start(ServerSpec(binary, model), tmp_path / "logs")
    try:
        error = LlamaClientError("HTTP 400", kind="http", url="u")
        assert server.explain(error) is None and server.alive()
    finally:
        server.stop()


def test_log_is_bounded_and_keeps_its_head_and_latest_tail(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
):
    import triage.llama.launcher as launcher

    monkeypatch.setattr(launcher, "LOG_LIMIT_BYTES", 20_000)
    monkeypatch.setattr(launcher, "LOG_KEEP_TAIL_BYTES", 4_000)
    chatty = script(
        tmp_path,
        "srv",
        FAKE_SERVER.replace(
            'print("main: server',
            'print("\\n".join(f"trace line {i}" for i in range(50000)))\n'
            'print("last words", flush=True)\nprint("main: server',
        ),
    )
    server = start(ServerSpec(chatty, model), tmp_path / "logs")
    try:
        # Still running: the tail past the limit is in memory, and reports see it.
        assert server.log_tail(2).splitlines()[-1].startswith("main: server is listening")
        assert server.crash_report().cpu_features == {"AVX2": "1", "REPACK": "1"}  # the head
    finally:
        server.stop()
    text = server.log_path.read_text()
    assert len(text) < 20_000 + 4_000 + 600  # + the argv line and the marker
    assert text.startswith("# argv:") and "system_info" in text
    assert "# [triage] log limit of 20000 bytes reached" in text
    assert "last words" in text and "trace line 49999" in text
    assert "trace line 20000" not in text  # the middle was dropped


def test_drill_run_on_a_server_that_stops_answering_says_it_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from triage.drills import build_drill
    from triage.drills.run import run_drill

    template = tmp_path / "template.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    monkeypatch.setenv("TRIAGE_GEMMA4_TEMPLATE", str(template))
    drill = build_drill("gemma4-toolcall", tmp_path / "drill")
    binary = script(tmp_path, "srv", FAKE_SERVER)
    with pytest.raises(LlamaClientError) as info:
        run_drill(drill, log_dir=tmp_path / "logs", binary=binary, timeout=1, contrasts=False)
    report = info.value.report
    assert report is not None and report.phase == "hang"
    assert "llama-server hung (serving): a request got no complete answer" in str(info.value)
    assert running_servers() == []


def test_health_from_another_process_on_the_port_is_not_ours(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
):
    """A slow-starting binary (a wrapper) whose port another server holds: that server's
    /health 200 must not count as ours; ours then fails to bind and is reported."""
    import triage.llama.launcher as launcher

    first = start(ServerSpec(script(tmp_path, "srv", FAKE_SERVER), model), tmp_path / "a")
    slow = script(
        tmp_path,
        "slow",
        """
        import socket, sys, time
        args = sys.argv[1:]
        time.sleep(1.0)  # an interpreter or wrapper starting up
        try:
            socket.create_server(("127.0.0.1", int(args[args.index("--port") + 1])))
        except OSError as exc:
            print("couldn't bind HTTP server socket:", exc, flush=True)
            sys.exit(1)
        time.sleep(3600)
    """,
    )
    monkeypatch.setattr(launcher, "port_in_use", lambda port, host="127.0.0.1": False)
    try:
        with pytest.raises(ServerStartError) as info:
            start(ServerSpec(slow, model), tmp_path / "b", port=first.port, ready_timeout=20)
        assert "exited with code 1 during startup" in str(info.value)
        assert f"port {first.port} on 127.0.0.1 is already in use" in str(info.value)
        assert first.alive() and running_servers() == [first]
    finally:
        first.stop()
