"""Start and stop llama-server variants: argv lists, loopback, a free port, health wait, logs.

Every server started here is stopped again, in layers:

* the `launch` context manager (also on exceptions and KeyboardInterrupt) and
  `RunningServer.stop`: SIGTERM, then SIGKILL after a grace period;
* an atexit hook that stops whatever is still registered when Python exits normally;
* a SIGTERM handler (installed from the main thread when none is set) that stops the
  servers before Python dies of the signal, which would skip atexit;
* on Linux, servers started from the main thread (or a thread that called
  `die_with_this_thread`) get PR_SET_PDEATHSIG, so even a SIGKILL of
  Python takes them down. (Not from other threads by default: the signal fires when the
  *thread* that started the child ends.)

A server that dies or hangs raises an error carrying a `CrashReport` (triage.llama.crash):
`ServerStartError.report` (phase "startup", or "hang" when /health never answered),
`ServerCrashed.report` from `check()`/`explain()` (phase "mid-request") and `ServerHung`
from `hung()`/`explain()` (phase "hang", server stopped). Servers run at `-lv 4`, the level
at which llama-server prints its `system_info` line; their output reaches the log through a
pipe, bounded to LOG_LIMIT_BYTES plus the last LOG_KEEP_TAIL_BYTES.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from triage.capture.redact import redact_args
from triage.llama.crash import CrashReport, crash_report, host_cpu_flags, read_log
from triage.llama.ports import (
    LOOPBACK,
    free_port,
    group_socket_inodes,
    listening_inodes,
    port_in_use,
)
from triage.llama.serverlog import LogPump, read_tail

# Flags the launcher owns; a spec that sets them would fight over the listening socket.
RESERVED_FLAGS = frozenset({"--host", "--port", "-m", "--model"})
STOP_GRACE_SECONDS = 5.0
HEALTH_POLL_SECONDS = 0.05
# llama-server prints its `system_info:` line (CPU features, REPACK) only at trace level (4);
# the crash report needs it. Measured on b11434 with a drill: 13.6 KB at startup and ~4.4 KB
# per request at -lv 4, vs 0.9 KB and ~1.0 KB at the default level 3 (lines per request,
# never per token).
TRACE_VERBOSITY = 4
# Per server log: the first LOG_LIMIT_BYTES, then only the last LOG_KEEP_TAIL_BYTES.
LOG_LIMIT_BYTES = 16 * 1024 * 1024
LOG_KEEP_TAIL_BYTES = 256 * 1024
VERBOSITY_FLAGS = frozenset(
    {"-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose"}
)


class _ReportedError(RuntimeError):
    """An error that carries the server's CrashReport (None when there is nothing to report,
    e.g. a missing model file) and its log tail."""

    def __init__(
        self, message: str, *, report: CrashReport | None = None, log_tail: str | None = None
    ) -> None:
        super().__init__(message)
        self.report = report
        if log_tail is None:
            log_tail = "\n".join(report.log_tail) if report is not None else ""
        self.log_tail = log_tail


class ServerStartError(_ReportedError):
    """llama-server did not become healthy (bad spec, exit during load, timeout).

    `report` is a CrashReport when the process ran and died (phase "startup") or never
    answered /health (phase "hang")."""


class ServerCrashed(_ReportedError):
    """A running llama-server exited without being asked to (`report.phase` "mid-request")."""


class ServerHung(ServerCrashed):
    """A running llama-server stopped answering: a request got no complete answer in time
    while the process still ran (`report.phase` "hang"). The server has been stopped."""


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration: which binary, which weights, which extra flags."""

    binary: Path
    model: Path
    args: list[str] = field(default_factory=list)

    def argv(self, port: int, host: str = LOOPBACK) -> list[str]:
        """The exact argv the launcher runs (no shell is involved)."""
        clashes = sorted(RESERVED_FLAGS.intersection(self.args))
        if clashes:
            raise ServerStartError(
                f"server args must not set {', '.join(clashes)}: the launcher chooses the "
                "model, host and port"
            )
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            host,
            "--port",
            str(port),
            *self.args,
        ]


class RunningServer:
    """A llama-server process started by `launch`/`start`."""

    def __init__(
        self,
        spec: ServerSpec,
        process: subprocess.Popen[bytes],
        host: str,
        port: int,
        log_path: Path,
        argv: list[str],
    ) -> None:
        self.spec = spec
        self.process = process
        self.host = host
        self.port = port
        self.log_path = log_path
        self.argv = argv
        self.started_at = time.monotonic()
        self.launch_seconds: float | None = None
        self.log_pump: LogPump | None = None
        self._stopping = False
        self._lock = threading.RLock()

    @property
    def pid(self) -> int:
        """Process id of the server."""
        return self.process.pid

    @property
    def base_url(self) -> str:
        """http://host:port of the server."""
        return f"http://{self.host}:{self.port}"

    @property
    def returncode(self) -> int | None:
        """Exit code once the process has ended, else None."""
        return self.process.poll()

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process.poll() is None

    def _drain_log(self) -> bytes:
        """Output not in the log file yet; waits briefly for the rest once the process ended."""
        if self.log_pump is None:
            return b""
        if self.process.poll() is not None:
            self.log_pump.join(timeout=2.0)
        return self.log_pump.pending()

    def log_text(self) -> str:
        """The log's head and tail (bounded, see crash.read_log), including pending output."""
        pending = self._drain_log()[-LOG_KEEP_TAIL_BYTES:]
        return read_log(self.log_path) + pending.decode("utf-8", errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log."""
        pending = self._drain_log()
        if not pending:
            return read_tail(self.log_path, lines)
        text = pending.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def crash_report(self, phase: str | None = None, detail: str = "") -> CrashReport:
        """What the log and exit status say now. Phase by default: "hang" while the process
        runs, "startup" before it was healthy, else "mid-request"."""
        code = self.process.poll()
        if phase is None:
            phase = (
                "hang"
                if code is None
                else ("startup" if self.launch_seconds is None else "mid-request")
            )
        return crash_report(
            phase,
            exit_code=code,
            log_text=self.log_text(),
            host_flags=host_cpu_flags(),
            detail=detail,
            log_path=str(self.log_path),
        )

    def check(self) -> None:
        """Raise ServerCrashed (with its CrashReport) if the server has exited without `stop`."""
        code = self.process.poll()
        if code is not None and not self._stopping:
            report = self.crash_report("startup" if self.launch_seconds is None else "mid-request")
            raise ServerCrashed(
                f"llama-server (pid {self.pid}, port {self.port}) exited with code {code}; "
                f"{report.sentence()}\nlog {self.log_path}:\n{self.log_tail(25)}",
                report=report,
                log_tail=self.log_tail(25),
            )

    def hung(self, detail: str) -> ServerHung:
        """Declare the server hung (e.g. a request never answered): stop it (the whole process
        group) and return the ServerHung error with its report, for the caller to raise."""
        report = self.crash_report("hang", detail)  # read before stopping: still running
        tail = self.log_tail(25)
        self.stop(grace=2.0)
        return ServerHung(
            f"llama-server (pid {self.pid}, port {self.port}) hung: {detail}; stopped it. "
            f"{report.sentence()}\nlog {self.log_path}:\n{tail}",
            report=report,
            log_tail=tail,
        )

    def explain(self, error: BaseException) -> ServerCrashed | None:
        """Turn a failed request into a server failure when the server is why: it died
        (ServerCrashed, phase "mid-request") or it is still running but the request timed out
        (ServerHung, the server stopped). None when the server looks fine."""
        if self._stopping:
            return None
        # A dying server can drop the connection a moment before its exit status is there.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=0.5)
        try:
            self.check()
        except ServerCrashed as crashed:
            return crashed
        if getattr(error, "kind", None) == "timeout" or isinstance(
            error, (TimeoutError, httpx.TimeoutException)
        ):
            return self.hung(f"a request got no complete answer ({error})")
        return None

    def _signal_group(self, sig: int) -> None:
        # The server leads its own session (start_new_session), so its process group holds
        # anything it started too: a wrapper script's server child must not outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL (the whole process group);
        returns the exit code."""
        with self._lock:
            self._stopping = True
            if self.process.poll() is None:
                self._signal_group(signal.SIGTERM)
                # A stopped (SIGSTOP'd, hung in a debugger) server only acts on SIGTERM once
                # continued.
                self._signal_group(signal.SIGCONT)
                try:
                    self.process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.process.wait(timeout=grace)
            # Stragglers of the group (children of a wrapper that already exited).
            self._signal_group(signal.SIGKILL)
            if self.log_pump is not None:
                self.log_pump.join(timeout=2.0)
            _REGISTRY.discard(self)
            return self.process.returncode

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited {self.returncode}"
        return f"<RunningServer pid={self.pid} {self.base_url} {state}>"


class _Registry:
    """Servers not yet stopped; the atexit hook stops them."""

    def __init__(self) -> None:
        self._servers: set[RunningServer] = set()
        # Reentrant: the SIGTERM handler may run while the main thread holds it.
        self._lock = threading.RLock()

    def add(self, server: RunningServer) -> None:
        with self._lock:
            self._servers.add(server)

    def discard(self, server: RunningServer) -> None:
        with self._lock:
            self._servers.discard(server)

    def running(self) -> list[RunningServer]:
        with self._lock:
            return list(self._servers)

    def stop_all(self) -> None:
        for server in self.running():
            with contextlib.suppress(Exception):
                server.stop(grace=2.0)


_REGISTRY = _Registry()
atexit.register(_REGISTRY.stop_all)


def _on_sigterm(signum: int, frame: object) -> None:
    _REGISTRY.stop_all()
    # Then die of SIGTERM as if no handler had been installed.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


_PR_SET_PDEATHSIG = 1
_THREAD = threading.local()


def die_with_this_thread() -> None:
    """Servers started from the calling thread get PR_SET_PDEATHSIG too (the main thread's
    always do). Linux sends that signal when the *thread* that started the child ends, not
    the process: call this only in a thread that outlives every server it starts (a worker
    of a pool that stops its servers before its threads, as engine.launches.LaunchPool)."""
    _THREAD.die_with_parent = True


def _preexec() -> Callable[[], None] | None:
    """preexec_fn that makes the child die with us (main thread or a thread that asked for
    it, Linux), else None."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    allowed = on_main_thread or getattr(_THREAD, "die_with_parent", False)
    if not (sys.platform.startswith("linux") and allowed):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child

    def die_with_parent() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))

    return die_with_parent


def running_servers() -> list[RunningServer]:
    """Servers started by this process and not stopped yet."""
    return _REGISTRY.running()


def _child_env() -> dict[str, str]:
    # llama-server reads LLAMA_ARG_* from the environment; a stray LLAMA_ARG_PORT or
    # LLAMA_ARG_MODEL would silently change the variant under test.
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}


def _serves_port(server: RunningServer) -> bool:
    """False only when we can see that another process listens on the server's port: a 200
    from /health then came from that one (a server that lost the bind race exits soon, but a
    slow-starting binary -- a wrapper script -- may not have tried yet). True when unsure."""
    listening = listening_inodes(server.port)
    if not listening:
        return True
    try:
        return bool(listening & group_socket_inodes(server.pid))  # own session: pgid = pid
    except OSError:
        return True


def _wait_healthy(server: RunningServer, ready_timeout: float) -> None:
    deadline = time.monotonic() + ready_timeout
    url = f"{server.base_url}/health"
    last_status = "no answer"
    # Plain HTTP on loopback: no TLS context (loading the CA bundle cost ~26 ms a launch).
    with httpx.Client(timeout=2.0, trust_env=False, verify=False) as client:
        while True:
            code = server.process.poll()
            if code is not None:
                raise _exit_error(server, code)
            try:
                response = client.get(url)
                if response.status_code == 200 and _serves_port(server):
                    return
                last_status = f"HTTP {response.status_code}"  # 503 while loading
            except httpx.HTTPError as exc:
                last_status = type(exc).__name__
            if time.monotonic() >= deadline:
                detail = f"no healthy /health within {ready_timeout:g}s (last: {last_status})"
                report = server.crash_report("hang", detail)
                raise ServerStartError(
                    f"llama-server on port {server.port} not healthy within {ready_timeout:g}s "
                    f"(last /health: {last_status}); {report.sentence()}\n"
                    f"log {server.log_path}:\n{server.log_tail(25)}",
                    report=report,
                    log_tail=server.log_tail(25),
                )
            time.sleep(HEALTH_POLL_SECONDS)


def _exit_error(server: RunningServer, code: int) -> ServerStartError:
    tail = server.log_tail(25)
    hint = ""
    if "couldn't bind" in tail or "Address already in use" in tail:
        hint = f" (port {server.port} on {server.host} is already in use)"
    report = server.crash_report("startup")
    return ServerStartError(
        f"llama-server exited with code {code} during startup{hint}; {report.sentence()}\n"
        f"argv {redact_args(server.argv)}; log {server.log_path}:\n{tail}",
        report=report,
        log_tail=tail,
    )


def start(
    spec: ServerSpec,
    log_dir: Path,
    ready_timeout: float = 60.0,
    *,
    port: int | None = None,
    host: str = LOOPBACK,
    metrics: bool = True,
    verbosity: int | None = TRACE_VERBOSITY,
) -> RunningServer:
    """Start a server and wait until /health is 200; the caller must `stop()` it."""
    binary = Path(spec.binary)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise ServerStartError(f"llama-server binary not found or not executable: {binary}")
    if not Path(spec.model).is_file():
        raise ServerStartError(f"model file not found: {spec.model}")
    if port is not None and port_in_use(port, host):
        raise ServerStartError(f"port {port} on {host} is already in use")
    chosen_port = port if port is not None else free_port(host)
    extra = []
    if metrics and "--metrics" not in spec.args:
        extra.append("--metrics")
    if verbosity is not None and not VERBOSITY_FLAGS.intersection(spec.args):
        extra += ["-lv", str(verbosity)]
    full_spec = ServerSpec(spec.binary, spec.model, [*spec.args, *extra]) if extra else spec
    argv = full_spec.argv(chosen_port, host)

    _install_sigterm_handler()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{chosen_port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # The log is kept and shown: secret-bearing flags (--api-key ...) are masked in it.
    log_path.write_bytes(f"# argv: {redact_args(argv)}\n".encode())
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        # Through a pipe, so the log stays bounded (LogPump). If Python dies, the server's
        # next write fails (SIGPIPE) when nothing else stopped it.
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_child_env(),
        # Own session: a Ctrl-C in the terminal reaches Python, which stops the server
        # in order, instead of killing the server under a request.
        start_new_session=True,
        preexec_fn=_preexec(),
    )
    server = RunningServer(full_spec, process, host, chosen_port, log_path, argv)
    assert isinstance(process.stdout, io.BufferedReader)
    server.log_pump = LogPump(process.stdout, log_path, LOG_LIMIT_BYTES, LOG_KEEP_TAIL_BYTES)
    _REGISTRY.add(server)
    try:
        _wait_healthy(server, ready_timeout)
    except BaseException:
        server.stop(grace=2.0)
        raise
    server.launch_seconds = time.monotonic() - server.started_at
    return server


@contextlib.contextmanager
def launch(
    spec: ServerSpec,
    log_dir: Path,
    ready_timeout: float = 60.0,
    *,
    port: int | None = None,
    host: str = LOOPBACK,
    metrics: bool = True,
    verbosity: int | None = TRACE_VERBOSITY,
) -> Iterator[RunningServer]:
    """Context manager: a healthy server for the block, stopped afterwards whatever happens."""
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        try:
            server = start(
                spec,
                log_dir,
                ready_timeout,
                port=port,
                host=host,
                metrics=metrics,
                verbosity=verbosity,
            )
            break
        except ServerStartError as exc:
            # A free port can be taken between our probe and the server's bind: retry.
            if "already in use" not in str(exc) or attempt == attempts - 1:
                raise
    try:
        yield server
    finally:
        server.stop()
