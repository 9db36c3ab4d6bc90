"""`triage ui --auth-header` in a real browser: the page opens only for requests that carry
the user header a trusted reverse proxy sets (issue 18, UI for a team).

Chromium stands in for the proxy by adding the header to every request (the WebSocket
handshake included), which is what the Streamlit server reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from uiserver import CHROMIUM, CHROMIUM_ARGS, REPO, require_chromium, running_ui

from kb.repo.files import import_paths
from kb.repo.store import Store

pytestmark = pytest.mark.browser

HEADER = "X-Forwarded-User"


@pytest.fixture
def header_ui(tmp_path: Path) -> Iterator[str]:
    require_chromium()
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        import_paths(store, [REPO / "incidents"])
    finally:
        store.close()
    env = dict(os.environ, TRIAGE_DATABASE_URL=url, TRIAGE_HOME=str(tmp_path / "home"))
    with running_ui(["--auth-header", HEADER], tmp_path, env) as base:
        yield base


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
