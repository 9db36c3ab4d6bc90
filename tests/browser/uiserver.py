"""What both browser tests need: Debian's Chromium, and `triage ui` started on a free port
in its own process group, waited for until healthy, and stopped afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("TRIAGE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
START_TIMEOUT = 60.0


def require_chromium() -> None:
    """Skip without Chromium, except on CI, where `make test` must have installed it."""
    if not CHROMIUM.exists():
        message = f"Chromium not found at {CHROMIUM} (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_ui(args: Sequence[str], tmp_path: Path, env: Mapping[str, str]) -> Iterator[str]:
    """`triage ui --port P --host 127.0.0.1 ARGS...` run from `tmp_path` (log in ui.log):
    yields its base URL once /_stcore/health answers, and stops it on exit."""
    port = free_port()
    log_path = tmp_path / "ui.log"
    triage = Path(sys.executable).with_name("triage")
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [str(triage), "ui", "--port", str(port), "--host", "127.0.0.1", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=tmp_path,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if server.poll() is not None:
                    pytest.fail(
                        f"triage ui exited ({server.returncode}): "
                        + log_path.read_text(errors="replace")
                    )
                try:
                    if httpx.get(f"{base}/_stcore/health", timeout=2).text.strip() == "ok":
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(
                        "triage ui did not become healthy: " + log_path.read_text(errors="replace")
                    )
                time.sleep(0.3)
            yield base
        finally:
            stop(server)


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server started here (its own process group), never anything else.

    Streamlit waits for a running script on SIGTERM (a triage can take minutes), so
    SIGKILL follows after a grace period.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if server.poll() is not None:
            return
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            continue
    if server.poll() is None:
        server.kill()
        server.wait(timeout=15)
