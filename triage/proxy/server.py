"""Serving the proxy app with uvicorn: in the foreground (the CLI) or in a thread (tests,
benchmarks), always on an explicit host and port (port 0: a free one)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from triage.proxy.forward import ProxyApp
from triage.proxy.guard import guarded_protocol


def uvicorn_config(app: Any, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    """Uvicorn settings that keep the proxy transparent: no Server/Date headers of its own
    (the upstream's are passed through), lifespan on (the upstream pool and the writer).
    For the proxy app, the client limits (triage.proxy.guard) are in the HTTP protocol;
    uvicorn's `limit_concurrency` stays off: it only answers 503 once a request head is
    complete, which a slow or endless head never is (the guard bounds connections at
    accept instead)."""
    http: Any = "auto"
    if isinstance(app, ProxyApp):
        http = guarded_protocol(app.config.client_limits, app.metrics)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        http=http,
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=30,
        limit_concurrency=None,
    )


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`) -> (host, port); a clear error for anything else."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {value!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port_text)


class ThreadedServer:
    """A uvicorn server on a background thread; `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = uvicorn.Server(uvicorn_config(app, host, port))
        self.thread = threading.Thread(target=self.server.run, name="triage-proxy", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.02)
        sockets = [s for server in self.server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[ThreadedServer]:
    """Serve `app` on a thread for the duration of the block (stopped also on failure)."""
    server = ThreadedServer(app, host, port)
    try:
        yield server.start()
    finally:
        server.stop()
