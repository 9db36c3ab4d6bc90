"""Crash reports with the real llama-server: the AMX stand-in (segfaults at warm-up unless
--no-repack, then runs the real binary), a real server killed mid-request, a real server that
stops answering, and `triage demo` meeting a crashing server. No process outlives a test."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from triage.drills import Drill
from triage.drills.standin import write_amx_crash_standin
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.crash import crash_report, read_log
from triage.llama.launcher import (
    ServerCrashed,
    ServerHung,
    ServerSpec,
    ServerStartError,
    running_servers,
    start,
)

pytestmark = pytest.mark.integration

LONG_ARGS = ["-c", "8192", "-np", "1", "-t", "1", "-tb", "1"]


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _without_no_repack(args: list[str]) -> list[str]:
    return [arg for arg in args if arg != "--no-repack"]


@pytest.fixture
def standin(server_binary: Path, tmp_path: Path) -> Path:
    return write_amx_crash_standin(server_binary, tmp_path / "standin" / "llama-server")


def test_standin_without_no_repack_gives_a_startup_crash_report(
    standin: Path, thinking_drill: Drill, plain_args: list[str], tmp_path: Path
):
    spec = ServerSpec(standin, thinking_drill.model, _without_no_repack(plain_args))
    with pytest.raises(ServerStartError) as info:
        start(spec, tmp_path / "logs", ready_timeout=30)
    report = info.value.report
    assert report is not None and report.phase == "startup"
    assert report.signal == "SIGSEGV" and report.exit_code == -11
    assert report.backtrace_symbol == "ggml_backend_amx_mul_mat"
    assert report.cpu_features["AMX_INT8"] == "1" and report.repack is True
    assert report.amx_buffer and report.amx_suspected
    assert "SIGSEGV" in report.sentence() and "--no-repack" in report.sentence()
    assert running_servers() == []


def test_standin_with_no_repack_runs_the_real_drill_server(
    standin: Path, thinking_drill: Drill, plain_args: list[str], tmp_path: Path
):
    args = [*_without_no_repack(plain_args), "--no-repack"]
    server = start(ServerSpec(standin, thinking_drill.model, args), tmp_path / "logs")
    try:

        async def ask() -> tuple[int, str | None]:
            async with LlamaClient(server.base_url, timeout=120) as client:
                result = await client.chat(thinking_drill.request("greedy"))
                return result.status_code, result.finish_reason

        assert asyncio.run(ask()) == (200, "length")  # the drill's designed failure
        # The real binary's own system_info (printed at the launcher's -lv 4) is parsed.
        report = crash_report("mid-request", log_text=read_log(server.log_path))
        assert "REPACK" in report.cpu_features and "AVX2" in report.cpu_features
    finally:
        server.stop()
    assert _gone(server.pid)


def test_real_server_killed_mid_request_gives_a_mid_request_report(
    thinking_drill: Drill, server_factory
):
    server = server_factory(thinking_drill.model, LONG_ARGS)

    async def scenario() -> LlamaClientError:
        async with LlamaClient(server.base_url, timeout=60) as client:
            request = asyncio.create_task(
                client.chat({**thinking_drill.request("greedy"), "max_tokens": 8000})
            )
            for _ in range(200):  # until the slot is busy generating
                if any(slot.get("is_processing") for slot in await client.slots()):
                    break
                await asyncio.sleep(0.01)
            os.kill(server.pid, signal.SIGSEGV)
            with pytest.raises(LlamaClientError) as info:
                await request
            return info.value

    error = asyncio.run(scenario())
    crashed = server.explain(error)
    assert isinstance(crashed, ServerCrashed) and not isinstance(crashed, ServerHung)
    report = crashed.report
    assert report is not None and report.phase == "mid-request"
    assert report.signal == "SIGSEGV" and report.cpu_features  # system_info was logged
    assert "in the middle of a request" in report.sentence()
    assert _gone(server.pid)


def test_real_server_that_stops_answering_gives_a_hang_report(
    thinking_drill: Drill, server_factory
):
    server = server_factory(thinking_drill.model, LONG_ARGS)
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)  # alive, listening socket open, never answers

    async def ask() -> None:
        async with LlamaClient(server.base_url, timeout=2) as client:
            await client.chat(thinking_drill.request("greedy"))

    with pytest.raises(LlamaClientError) as info:
        asyncio.run(ask())
    hung = server.explain(info.value)
    assert isinstance(hung, ServerHung)
    assert hung.report is not None and hung.report.phase == "hang"
    assert hung.report.exit_code is None and "no complete answer" in hung.report.detail
    assert _gone(pid)  # stopped even though it was frozen


def test_demo_prints_a_crash_message_not_a_traceback(
    standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from triage.cli import cli

    monkeypatch.setenv("LLAMA_SERVER_BIN", str(standin))
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "fpu sse2 avx2")  # a host without AMX: no flag
    result = CliRunner().invoke(cli, ["demo", "--no-ui", "--dir", str(tmp_path / "demo")])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert (
        "the demo's llama-server failed: llama-server crashed with SIGSEGV during "
        "startup (warm-up) in ggml_backend_amx_mul_mat" in result.output
    )
    assert "server log:" in result.output
    assert running_servers() == []


def test_demo_drill_on_simulated_amx_host_avoids_the_crash(
    standin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """With AMX flags the drill stack carries --no-repack, so the stand-in runs the real
    server and the demo's capture step gets a real failing exchange."""
    from triage.demo import capture_failing_exchange
    from triage.drills import build_drill

    monkeypatch.setenv("LLAMA_SERVER_BIN", str(standin))
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "avx512f amx_tile amx_int8")
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack_path = drill.out_dir / "stack.toml"
    assert "host workaround: --no-repack (AMX host, llama.cpp#20824)" in stack_path.read_text()
    request_path, response_path = capture_failing_exchange(
        stack_path, drill.request("greedy"), tmp_path
    )
    assert b'"finish_reason":"length"' in response_path.read_bytes().replace(b" ", b"")
    assert running_servers() == []


def test_no_repack_really_keeps_the_weights_out_of_the_repacked_layout(
    thinking_drill: Drill, server_factory
):
    """What the workaround changes on the real binary: no repacked weight buffer (on this
    Q4_0 drill model a CPU_REPACK buffer appears without the flag, AMX on an AMX host)."""
    from triage.llama.crash import host_cpu_flags, host_has_amx

    with_flag = server_factory(thinking_drill.model, [*LONG_ARGS, "--no-repack"])
    report = with_flag.crash_report("hang")
    assert report.cpu_features.get("REPACK") == "1"  # built with it ...
    assert report.buffers and not any(
        line.startswith(("CPU_REPACK ", "AMX ")) for line in report.buffers
    )  # ... not used
    if host_has_amx(host_cpu_flags()):
        return  # the suite runs every server with --no-repack here (tests/conftest.py)
    without = server_factory(thinking_drill.model, LONG_ARGS)
    assert any(line.startswith("CPU_REPACK ") for line in without.crash_report("hang").buffers)
