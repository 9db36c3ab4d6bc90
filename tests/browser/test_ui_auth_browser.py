"""`triage ui --auth-header` in a real browser: the page opens only for requests that carry
the user header a trusted reverse proxy sets (issue 18, UI for a team).

Chromium stands in for the proxy by adding the header to every request (the WebSocket
handshake included), which is what the Streamlit server reads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kb.files import import_paths
from kb.store import Store

pytestmark = pytest.mark.browser

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
HEADER = "X-Forwarded-User"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server this test started (its own process group), nothing else."""
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


@pytest.fixture
def header_ui(tmp_path: Path) -> Iterator[str]:
    if not CHROMIUM.exists():
        message = f"Chromium not found at {CHROMIUM} (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        import_paths(store, [REPO / "incidents"])
    finally:
        store.close()
    port = _free_port()
    log_path = tmp_path / "ui.log"
    triage = Path(sys.executable).with_name("triage")
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [
                str(triage),
                "ui",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--auth-header",
                HEADER,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
            env=dict(os.environ, TRIAGE_DATABASE_URL=url, TRIAGE_HOME=str(tmp_path / "home")),
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if server.poll() is not None:
                    pytest.fail(f"triage ui exited: {log_path.read_text(errors='replace')}")
                try:
                    if httpx.get(f"{base}/_stcore/health", timeout=2).text.strip() == "ok":
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"triage ui not healthy: {log_path.read_text(errors='replace')}")
                time.sleep(0.3)
            yield base
        finally:
            _stop(server)


def test_pages_open_only_with_the_proxy_header(header_ui: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            anonymous = browser.new_page()
            anonymous.set_default_timeout(60_000)
            anonymous.goto(header_ui)
            main = anonymous.locator('[data-testid="stMain"]')
            expect(main.get_by_text(f"the proxy sent no {HEADER} header")).to_be_visible(
                timeout=60_000
            )
            expect(main.get_by_role("heading", name="Incidents")).to_have_count(0)

            signed = browser.new_context(extra_http_headers={HEADER: "alice"}).new_page()
            signed.set_default_timeout(60_000)
            signed.goto(header_ui)
            expect(signed.get_by_text("Signed in as alice")).to_be_visible(timeout=60_000)
            expect(
                signed.locator('[data-testid="stMain"]')
                .get_by_role("heading", name="Incidents")
                .first
            ).to_be_visible(timeout=60_000)
        finally:
            browser.close()
