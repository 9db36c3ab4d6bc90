"""Server-level arms' servers started in the background (triage.engine.launches): every
server started is stopped, also one still starting when the run ends; a failed start is
the arm's error; arms whose models do not fit in memory together start in rounds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from triage.engine import launches
from triage.engine.launches import LaunchPool, launch_rounds, memory_available
from triage.engine.servers import Server
from triage.stackfile import ServerConfig


def _model(tmp_path: Path, name: str, size: int) -> ServerConfig:
    path = tmp_path / name
    path.write_bytes(b"\0" * size)
    return ServerConfig(model=path)


def test_rounds_keep_the_models_of_servers_running_together_within_half_the_memory(
    tmp_path: Path,
) -> None:
    a, b, c = (_model(tmp_path, f"{n}.gguf", 300) for n in "abc")
    # 1000 bytes available: 500 for arm servers, so two 300-byte models never run together.
    assert launch_rounds([("a", a), ("b", b), ("c", c)], 1000) == [["a"], ["b"], ["c"]]
    assert launch_rounds([("a", a), ("b", b), ("c", c)], 2000) == [["a", "b", "c"]]
    assert launch_rounds([("a", a), ("b", b), ("c", c)], 1300) == [["a", "b"], ["c"]]
    # A model larger than the whole budget still runs, alone.
    big = _model(tmp_path, "big.gguf", 5000)
    assert launch_rounds([("big", big), ("a", a)], 1000) == [["big"], ["a"]]
    assert launch_rounds([], 1000) == []


def test_memory_available_reads_meminfo_and_has_a_default(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemAvailable:   2048 kB\n")
    assert memory_available(meminfo) == 2048 * 1024
    assert memory_available(tmp_path / "missing") == launches.UNKNOWN_MEMORY


def test_a_failed_start_is_raised_to_the_arm_and_leaves_nothing_to_stop(tmp_path: Path) -> None:
    config = ServerConfig(
        model=_model(tmp_path, "m.gguf", 10).model, binary=Path("/nonexistent/llama-server")
    )
    with LaunchPool(tmp_path / "logs", 5.0) as pool:
        launch = pool.start("arm", config, "arm")
        with pytest.raises(Exception, match="not found or not executable"):
            launch.result()
    assert launch.stopped


def test_every_server_is_stopped_also_one_still_starting_when_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    release = threading.Event()

    @contextmanager
    def fake_open(config: ServerConfig, log_dir: Path, ready_timeout: float) -> Iterator[Server]:
        name = log_dir.name
        if name == "slow":
            release.wait(5.0)
        events.append(f"started {name}")
        try:
            yield Server(name, config, "http://127.0.0.1:1", 1, 0.1)
        finally:
            events.append(f"stopped {name}")

    monkeypatch.setattr(launches, "open_server", fake_open)
    config = ServerConfig(model=Path("m.gguf"))
    with pytest.raises(KeyboardInterrupt):
        with LaunchPool(tmp_path, 5.0) as pool:
            pool.start("fast", config, "fast")
            pool.start("slow", config, "slow")
            assert pool.launches["fast"].result().key == "fast"
            threading.Timer(0.2, release.set).start()
            raise KeyboardInterrupt  # Ctrl-C while "slow" is still starting
    # close() waited for the slow start to end, then stopped it: nothing left running.
    assert sorted(events) == ["started fast", "started slow", "stopped fast", "stopped slow"]
    assert events.index("stopped slow") > events.index("started slow")


def test_servers_start_at_the_same_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    both = threading.Barrier(2, timeout=5.0)

    @contextmanager
    def fake_open(config: ServerConfig, log_dir: Path, ready_timeout: float) -> Iterator[Server]:
        both.wait()  # raises BrokenBarrierError unless the other start runs meanwhile
        yield Server(log_dir.name, config, "http://127.0.0.1:1", 1, 0.1)

    monkeypatch.setattr(launches, "open_server", fake_open)
    config = ServerConfig(model=Path("m.gguf"))
    with LaunchPool(tmp_path, 5.0) as pool:
        first, second = pool.start("a", config, "a"), pool.start("b", config, "b")
        assert (first.result().key, second.result().key) == ("a", "b")
