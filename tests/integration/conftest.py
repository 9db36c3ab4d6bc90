"""Integration fixtures: the real llama-server binary, drills generated into temp folders,
and a server factory that always stops what it started.

The binary comes from $LLAMA_SERVER_BIN or the build cache (`triage server build`, which
`make test` runs first). Without it these tests fail under CI and skip elsewhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from triage.drills import Drill, build_drill
from triage.drills.host import host_workaround_args
from triage.llama.launcher import RunningServer, ServerSpec, running_servers, start

# Drill servers: one compute thread each (see triage.drills.registry.SERVER_ARGS), and
# --no-repack on an AMX host (triage.drills.host; the args show it).
PLAIN_ARGS = ["-c", "16384", "-np", "4", "-t", "1", "-tb", "1", *host_workaround_args()]


@pytest.fixture(scope="session")
def server_binary() -> Path:
    """The llama-server under test."""
    from triage.llama.build import find_server_binary

    try:
        return find_server_binary()
    except Exception as exc:  # noqa: BLE001 -- any reason the binary is missing
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is not built: {exc}")
        pytest.skip(f"llama-server is not built: {exc}")


@pytest.fixture(scope="session")
def thinking_drill(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Drill:
    """gemma4-thinking-budget, generated for this session."""
    return build_drill("gemma4-thinking-budget", tmp_path_factory.mktemp("thinking-drill"))


@pytest.fixture(scope="session")
def toolcall_drill(server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Drill:
    """gemma4-toolcall, generated for this session."""
    return build_drill("gemma4-toolcall", tmp_path_factory.mktemp("toolcall-drill"))


ServerFactory = Callable[..., RunningServer]


def _assert_gone(pid: int) -> None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"llama-server pid {pid} is still running")


@pytest.fixture
def server_factory(server_binary: Path, tmp_path: Path) -> Iterator[ServerFactory]:
    """start(model, args, **launch options) -> RunningServer; all stopped after the test."""
    started: list[RunningServer] = []

    def factory(model: Path, args: list[str] | None = None, **options) -> RunningServer:
        spec = ServerSpec(server_binary, model, list(PLAIN_ARGS if args is None else args))
        server = start(spec, tmp_path / "server-logs", **options)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()
        _assert_gone(server.pid)


@contextlib.contextmanager
def _serving(binary: Path, model: Path, args: list[str], log_dir: Path) -> Iterator[RunningServer]:
    server = start(ServerSpec(binary, model, args), log_dir)
    try:
        yield server
    finally:
        server.stop()
        _assert_gone(server.pid)


@pytest.fixture(scope="session")
def serve(server_binary: Path) -> Callable[..., contextlib.AbstractContextManager[RunningServer]]:
    """serve(model, args, log_dir): context manager for a server shared by a module."""
    return lambda model, args, log_dir: _serving(server_binary, model, list(args), log_dir)


@pytest.fixture(scope="session")
def plain_args() -> list[str]:
    """Drill server args without speculative decoding."""
    return list(PLAIN_ARGS)


@pytest.fixture(scope="session", autouse=True)
def _no_server_outlives_the_session() -> Iterator[None]:
    yield
    leaked = running_servers()
    for server in leaked:
        server.stop()
    assert not leaked, f"llama-server processes left running: {leaked}"
