"""Server-level arms' servers started in the background, while other arms replay.

A launch is `open_server` entered in a worker thread (the launcher blocks until /health
answers); the caller collects it when it needs the server. Every launch is stopped by
`close()` -- also one still starting (it waits for the start to end, then stops it), also on
failure or Ctrl-C (the owner enters the pool in an ExitStack). How many arm servers run at
once is bounded by memory: their model files summed must fit in half of the memory available
when the run starts (at least one at a time), so a large model's arms do not start together.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage.engine.servers import Server, open_server
from triage.llama.launcher import die_with_this_thread
from triage.stackfile import ServerConfig

__all__ = ["Launch", "LaunchPool", "launch_rounds", "memory_available"]

MEMINFO = Path("/proc/meminfo")
UNKNOWN_MEMORY = 4 * 1024**3  # bytes assumed available where /proc/meminfo cannot be read


def memory_available(meminfo: Path = MEMINFO) -> int:
    """Bytes of memory available to new processes (MemAvailable), or UNKNOWN_MEMORY."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return UNKNOWN_MEMORY


def _model_bytes(config: ServerConfig) -> int:
    if config.model is None:  # an external url: nothing is launched
        return 0
    try:
        return os.stat(config.model).st_size
    except OSError:
        return 0


def launch_rounds(configs: Sequence[tuple[str, ServerConfig]], available: int) -> list[list[str]]:
    """Arm names in rounds whose servers may run together: each round's model files summed
    fit in half of `available` bytes (a round holds at least one arm)."""
    budget = available // 2
    rounds: list[list[str]] = []
    used = 0
    for name, config in configs:
        size = _model_bytes(config)
        if not rounds or used + size > budget:
            rounds.append([])
            used = 0
        rounds[-1].append(name)
        used += size
    return rounds


@dataclass
class Launch:
    """One server starting (or started) in a worker thread."""

    name: str
    context: AbstractContextManager[Server]
    future: concurrent.futures.Future[Server]
    stopped: bool = False

    def result(self) -> Server:
        """The started server; raises what its start raised (ServerStartError, ...)."""
        return self.future.result()

    def stop(self) -> None:
        """Stop the server: waits for a start under way to end first. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self.future.result()
        except BaseException:  # noqa: BLE001 - a failed start stopped its own process
            return
        self.context.__exit__(None, None, None)


@dataclass
class LaunchPool:
    """Starts servers in worker threads; `close()` stops every one of them."""

    log_dir: Path
    ready_timeout: float
    launches: dict[str, Launch] = field(default_factory=dict)
    # How a server starts: a backend's launch (triage.engine.backend); None: open_server.
    opener: Callable[[ServerConfig, Path, float], AbstractContextManager[Server]] | None = None
    _executor: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self, name: str, config: ServerConfig, log_name: str) -> Launch:
        if self._executor is None:
            # The workers live until close(), which stops their servers first: their servers
            # may die with this process even on a SIGKILL (PR_SET_PDEATHSIG is per thread).
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="triage-launch", initializer=die_with_this_thread
            )
        opener = self.opener or open_server
        context = opener(config, self.log_dir / log_name, self.ready_timeout)
        launch = Launch(name, context, self._executor.submit(context.__enter__))
        self.launches[name] = launch
        return launch

    def __iter__(self) -> Iterator[Launch]:
        return iter(list(self.launches.values()))

    def close(self) -> None:
        """Stop every server (waiting for those still starting), then the threads."""
        errors: list[BaseException] = []
        for launch in self:
            try:
                launch.stop()
            except BaseException as exc:  # noqa: BLE001 - stop the others first
                errors.append(exc)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> LaunchPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
