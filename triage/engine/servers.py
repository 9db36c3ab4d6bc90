"""Server lifecycle: launch (or attach to) one configuration, health, death; always stopped."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triage.stackfile import ServerConfig

__all__ = ["EngineError", "Server", "open_server", "resolve_binary"]


class EngineError(Exception):
    """The engine cannot start (bad stack, no binary, no failing exchange)."""


@dataclass
class Server:
    key: str
    config: ServerConfig
    base_url: str
    slots: int
    launch_seconds: float
    handle: Any = None  # RunningServer, None for an external url
    failure: Any = None  # the CrashReport once it crashed mid-request or hung (explain)

    def alive(self) -> bool:
        return self.handle is None or bool(self.handle.alive())

    def log_tail(self) -> str:
        if self.handle is None:
            return ""
        try:
            return str(self.handle.log_tail(20))
        except Exception:  # noqa: BLE001 - best effort for an error message
            return ""

    def death_message(self) -> str:
        report = self.failure or self.crash_report()
        if report is not None:
            return f"server {self.config.describe()}: {report.sentence()}"
        code = getattr(self.handle, "returncode", None) if self.handle else None
        return f"server {self.config.describe()} died (exit code {code})"

    def crash_report(self) -> Any | None:
        """The launcher's CrashReport of a server that has exited, else None."""
        if self.handle is None or self.alive() or not hasattr(self.handle, "crash_report"):
            return None
        try:
            return self.handle.crash_report()
        except Exception:  # noqa: BLE001 - best effort for an error message
            return None

    def explain(self, error: str, timed_out: bool = False) -> Any | None:
        """After a request failed with `error`: the CrashReport when the server is why --
        it died (phase "mid-request") or it still runs but the request timed out (phase
        "hang"; the server is then stopped) -- else None (an external url: None)."""
        if self.handle is None or not hasattr(self.handle, "explain"):
            return None
        exc: BaseException = TimeoutError(error) if timed_out else ConnectionError(error)
        failure = self.handle.explain(exc)
        report = getattr(failure, "report", None) if failure is not None else None
        if report is not None and self.failure is None:
            self.failure = report
        return report


def resolve_binary(binary: Path | None) -> Path:
    """The llama-server binary of a configuration: a path, a name on PATH, or the built one."""
    from triage.llama.build import find_server_binary

    if binary is not None and "/" in str(binary):
        return Path(binary)
    if binary is None or str(binary) == "llama-server" and shutil.which("llama-server") is None:
        return find_server_binary()
    found = shutil.which(str(binary))
    if found is None:
        raise EngineError(f"binary {str(binary)!r} not found on PATH")
    return Path(found)


@contextmanager
def open_server(config: ServerConfig, log_dir: Path, ready_timeout: float) -> Iterator[Server]:
    """Launch (or attach to) one server configuration; always stopped on exit."""
    if config.model is None and config.url:
        yield Server(config.key(), config, config.url.rstrip("/"), 1, 0.0)
        return
    from triage.llama.launcher import ServerSpec, launch

    if config.model is None:
        raise EngineError("the server configuration has neither a model nor a url")
    spec = ServerSpec(binary=resolve_binary(config.binary), model=Path(config.model),
                      args=list(config.args))
    with launch(spec, log_dir=log_dir, ready_timeout=ready_timeout) as running:
        yield Server(config.key(), config, running.base_url, 1,
                     float(getattr(running, "launch_seconds", 0.0) or 0.0), running)


RESERVED_FLAGS = ("--host", "--port", "-m", "--model")


def check_config(config: ServerConfig, where: str) -> None:
    """Refuse, before anything launches, a configuration that cannot start: flags the
    launcher owns, missing model or flag files, a binary that does not exist."""
    from triage.stackfile import PATH_VALUE_FLAGS

    args = list(config.args)
    clashes = sorted({a.split("=", 1)[0] for a in args} & set(RESERVED_FLAGS))
    if clashes:
        raise EngineError(f"{where}: args must not set {', '.join(clashes)}: the engine "
                          "chooses the model, host and port of every server it launches")
    if config.model is None:
        return
    if not Path(config.model).is_file():
        raise EngineError(f"{where}: model file not found: {config.model}")
    for flag, value in zip(args, args[1:], strict=False):
        if flag in PATH_VALUE_FLAGS and flag != "--slot-save-path" and not Path(value).exists():
            raise EngineError(f"{where}: {flag} file not found: {value}")
    try:
        resolve_binary(config.binary)
    except EngineError as exc:
        raise EngineError(f"{where}: {exc}") from None
    except Exception as exc:  # no built binary and no $LLAMA_SERVER_BIN
        raise EngineError(f"{where}: {exc}") from None


def check_url(url: str, timeout: float = 5.0) -> None:
    """A running server at `url` must answer /health before a run records anything."""
    import asyncio

    from triage.llama.client import LlamaClient, LlamaClientError

    async def probe() -> int:
        async with LlamaClient(url, timeout=timeout) as client:
            return int((await client.health(timeout=timeout)).status_code)

    try:
        status = asyncio.run(probe())
    except LlamaClientError as exc:
        raise EngineError(f"$.server.url: {url} does not answer: {exc}") from None
    if status >= 400:
        raise EngineError(f"$.server.url: {url}/health answered HTTP {status}; the server "
                          "is not ready")
