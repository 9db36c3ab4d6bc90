"""The launcher and client against the real llama-server: start failures, a server killed
or frozen mid-request, and no process outliving its owner."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import triage.llama.launcher as launcher
from triage.drills import Drill
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.launcher import ServerCrashed, ServerSpec, ServerStartError, launch

pytestmark = pytest.mark.integration

# One slot with the whole context: a long greedy request keeps the server busy for seconds.
LONG_ARGS = ["-c", "8192", "-np", "1", "-t", "1", "-tb", "1"]


def long_request(drill: Drill) -> dict:
    return {**drill.request("greedy"), "max_tokens": 8000}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def test_missing_model_file(server_binary: Path, tmp_path: Path):
    with pytest.raises(ServerStartError, match="model file not found: .*missing.gguf"):
        with launch(ServerSpec(server_binary, tmp_path / "missing.gguf"), tmp_path):
            pass


def test_occupied_port(server_binary: Path, thinking_drill: Drill, tmp_path: Path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            with launch(ServerSpec(server_binary, thinking_drill.model), tmp_path, port=port):
                pass


def test_port_taken_after_the_check_is_reported_from_the_server_log(
    server_binary: Path, thinking_drill: Drill, server_factory, tmp_path: Path, monkeypatch
):
    """The race the pre-check cannot close: llama-server itself fails to bind."""
    first = server_factory(thinking_drill.model)
    monkeypatch.setattr(launcher, "port_in_use", lambda port, host="127.0.0.1": False)
    with pytest.raises(ServerStartError) as info:
        launcher.start(
            ServerSpec(server_binary, thinking_drill.model, ["-t", "1"]), tmp_path, port=first.port
        )
    message = str(info.value)
    assert "exited with code" in message
    assert f"port {first.port} on 127.0.0.1 is already in use" in message
    assert "couldn't bind HTTP server socket" in message  # the log tail
    assert first.alive()


def test_not_a_gguf_file(server_binary: Path, tmp_path: Path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"definitely not a model\n" * 10)
    with pytest.raises(ServerStartError) as info:
        with launch(ServerSpec(server_binary, bad, ["-t", "1"]), tmp_path):
            pass
    message = str(info.value)
    assert "exited with code 1 during startup" in message
    assert "broken.gguf" in message and "log" in message
    assert launcher.running_servers() == []


def test_killed_mid_request_gives_a_clear_error_without_hanging(
    thinking_drill: Drill, server_factory
):
    server = server_factory(thinking_drill.model, LONG_ARGS)

    async def scenario():
        async with LlamaClient(server.base_url, timeout=60) as client:
            request = asyncio.create_task(client.chat(long_request(thinking_drill)))
            for _ in range(200):  # until the slot is busy generating
                slots = await client.slots()
                if any(slot.get("is_processing") for slot in slots):
                    break
                await asyncio.sleep(0.01)
            os.kill(server.pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(LlamaClientError) as info:
                await request
            return info.value, time.monotonic() - started

    error, waited = asyncio.run(scenario())
    assert error.kind in {"disconnected", "connect"}
    assert "server may have crashed" in str(error) or "cannot connect" in str(error)
    assert waited < 10
    server.process.wait(timeout=10)  # our child: reap it (a zombie still answers kill 0)
    assert not server.alive()
    with pytest.raises(ServerCrashed, match="exited with code -9"):
        server.check()
    assert server.stop() == -9


def test_killed_mid_stream(thinking_drill: Drill, server_factory):
    server = server_factory(thinking_drill.model, LONG_ARGS)

    async def scenario():
        async with LlamaClient(server.base_url, timeout=60) as client:
            request = asyncio.create_task(client.chat_stream(long_request(thinking_drill)))
            await asyncio.sleep(0.3)
            os.kill(server.pid, signal.SIGKILL)
            with pytest.raises(LlamaClientError) as info:
                await request
            return info.value

    error = asyncio.run(scenario())
    assert error.kind in {"disconnected", "connect"}
    assert server.stop() == -9


def test_frozen_server_times_out(thinking_drill: Drill, server_factory):
    server = server_factory(thinking_drill.model)
    os.kill(server.pid, signal.SIGSTOP)
    try:

        async def scenario():
            async with LlamaClient(server.base_url, timeout=1.5) as client:
                started = time.monotonic()
                with pytest.raises(LlamaClientError) as info:
                    await client.chat(thinking_drill.request("greedy"))
                return info.value, time.monotonic() - started

        error, waited = asyncio.run(scenario())
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert error.kind == "timeout" and "within 1.5s" in str(error)
    assert 1.0 < waited < 5
    # With the abandoned request in flight llama-server may sit on SIGTERM for seconds;
    # stop() escalates to SIGKILL after the grace period either way.
    started = time.monotonic()
    assert server.stop(grace=1.0) in {0, -signal.SIGKILL}
    assert time.monotonic() - started < 5


def test_connection_refused_is_clear():
    port = launcher.free_port()

    async def scenario():
        async with LlamaClient(f"http://127.0.0.1:{port}", timeout=5) as client:
            await client.health()

    with pytest.raises(LlamaClientError, match="cannot connect to llama-server") as info:
        asyncio.run(scenario())
    assert info.value.kind == "connect"


def test_exception_inside_launch_stops_the_server(thinking_drill: Drill, server_binary, tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with launch(ServerSpec(server_binary, thinking_drill.model, ["-t", "1"]), tmp_path) as s:
            pid = s.pid
            assert s.alive() and s.launch_seconds < 30
            raise RuntimeError("boom")
    assert wait_gone(pid)
    assert launcher.running_servers() == []


OWNER_SCRIPT = textwrap.dedent("""
    import concurrent.futures, sys, time
    from pathlib import Path
    from triage.llama.launcher import ServerSpec, die_with_this_thread, start
    spec = ServerSpec(Path(sys.argv[1]), Path(sys.argv[2]), ["-t", "1"])
    if sys.argv[5] == "worker":  # as engine.launches.LaunchPool starts arm servers
        pool = concurrent.futures.ThreadPoolExecutor(1, initializer=die_with_this_thread)
        server = pool.submit(start, spec, Path(sys.argv[3])).result()
    else:
        server = start(spec, Path(sys.argv[3]))
    print(server.pid, flush=True)
    if sys.argv[4] == "exit":
        sys.exit(0)  # without stopping the server: the atexit hook must
    time.sleep(60)
""")


@pytest.mark.parametrize(
    "ending,thread",
    [("exit", "main"), ("sigterm", "main"), ("sigkill", "main"), ("sigkill", "worker")],
)
def test_server_does_not_outlive_its_owner(
    server_binary: Path, thinking_drill: Drill, tmp_path: Path, ending: str, thread: str
):
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER_SCRIPT,
            str(server_binary),
            str(thinking_drill.model),
            str(tmp_path),
            "exit" if ending == "exit" else "wait",
            thread,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = int(owner.stdout.readline())
        if ending == "sigterm":
            owner.send_signal(signal.SIGTERM)
        elif ending == "sigkill":
            owner.kill()
        owner.wait(timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.stdout.close()
    assert wait_gone(pid), f"llama-server {pid} outlived its owner ({ending}, {thread} thread)"
