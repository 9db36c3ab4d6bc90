"""The cause graph as Chromium draws it at 1400 px wide (issue 28 item 10): every label at
least 12 px on screen, label colours readable (WCAG AA, 4.5:1, as rendered), and one run
at a time. The screenshots are kept in artifacts/ui-cause-graph-SLUG.png."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bigrecord import SLUG as LARGE
from bigrecord import record as large_record
from uiserver import CHROMIUM, CHROMIUM_ARGS, REPO, require_chromium, running_ui

from kb.repo.files import import_paths, render_record
from kb.repo.store import Store

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "artifacts"
REFERENCE = "2026-06-10-gemma4-empty-response"
MIN_PX = 12.0

# Per label: its font size on screen (font-size x the SVG's scale to the page), its text
# colour and the fill of the shape it sits on.
MEASURE = """() => {
  const svg = document.querySelector('[data-testid="stGraphVizChart"] svg');
  const out = [];
  for (const node of svg.querySelectorAll('g.node')) {
    const shape = node.querySelector('path, polygon, ellipse');
    for (const text of node.querySelectorAll('text')) {
      const size = parseFloat(text.getAttribute('font-size') || '14');
      const scale = text.getScreenCTM().a;
      out.push({text: text.textContent, px: size * scale,
                font: text.getAttribute('fill') || '#000000',
                fill: shape ? shape.getAttribute('fill') : '#ffffff'});
    }
  }
  return {labels: out, width: svg.getBoundingClientRect().width};
}"""


def _luminance(colour: str) -> float:
    value = colour.lstrip("#")
    if len(value) == 3:
        value = "".join(c * 2 for c in value)
    channels = [int(value[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.fixture
def ui_server(tmp_path: Path) -> Iterator[str]:
    require_chromium()
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    large = tmp_path / f"{LARGE}.md"
    large.write_text(render_record(large_record()), "utf-8")
    store = Store(url)
    try:
        import_paths(store, [REPO / "incidents", large])
    finally:
        store.close()
    env = dict(os.environ, TRIAGE_DATABASE_URL=url)
    with running_ui([], tmp_path, env) as base:
        yield base


@pytest.mark.parametrize(("slug", "evidence"), [(REFERENCE, False), (LARGE, False), (LARGE, True)])
def test_cause_graph_labels_are_large_and_readable_at_1400_px(
    ui_server: str, slug: str, evidence: bool
) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(f"{ui_server}/incident?slug={slug}")
            svg = page.locator('[data-testid="stGraphVizChart"] svg').first
            # A click on the tab while the page is still rerunning can be lost (seen once in
            # CI: the graph stayed in a hidden tab for 60 s); click again, three times at most.
            for attempt in range(3):
                page.get_by_role("tab", name="Cause graph").click()
                try:
                    expect(svg).to_be_visible(timeout=20_000)
                    break
                except AssertionError:
                    if attempt == 2:
                        raise
            if evidence:
                page.get_by_text("Show evidence nodes").click()
                expect(svg.locator("g.node").filter(has_text="E1:").first).to_be_visible()
            page.wait_for_timeout(500)
            svg.scroll_into_view_if_needed()
            page.screenshot(
                path=str(ARTIFACTS / f"ui-cause-graph-{slug}{'-evidence' if evidence else ''}.png")
            )
            measured = page.evaluate(MEASURE)
        finally:
            browser.close()
    labels = measured["labels"]
    assert len(labels) > 10
    small = [(label["text"], round(label["px"], 1)) for label in labels if label["px"] < MIN_PX]
    assert small == [], f"labels under {MIN_PX} px at 1400 px wide: {small[:5]}"
    unreadable = [
        (label["text"], label["font"], label["fill"])
        for label in labels
        if contrast(label["font"], label["fill"]) < 4.5
    ]
    assert unreadable == [], unreadable
