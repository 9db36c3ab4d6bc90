"""Recorded text is shown as text on every page: markup in a cause title never becomes HTML."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kb.repo.files import import_paths
from kb.repo.store import Store
from triage.ui import data
from triage.ui.text import markdown_to_html, md_escape, md_link, md_unescape, safe_url

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")
SLUG = "2026-07-02-markup-everywhere"
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
HOSTILE = f"{SCRIPT} {IMG} :red[x] $x$ [click](javascript:alert(1))"
TITLE = f"Cause {SCRIPT}{IMG}"

INCIDENT = f"""---
slug: {SLUG}
title: 'Incident {SCRIPT}'
status: parked
opened: 2026-07-02
summary: '{HOSTILE}'
impact: '{IMG}'
stack: {{model: '{IMG}', flags: ['{SCRIPT}']}}
symptoms:
  - {{id: S1, kind: empty-content, description: '{HOSTILE}', evidence: [E1]}}
evidence:
  - id: E1
    kind: exchange
    summary: '{HOSTILE}'
    source: '{IMG}'
    recorded_at: 2026-07-02
    payload: {{request: {{messages: [{{role: user, content: '{SCRIPT}'}}]}}}}
causes:
  - id: reasoning-exhausts-budget
    catalogue: reasoning-exhausts-budget
    title: '{TITLE}'
    status: suspected
    basis: untested
    rationale: '{HOSTILE}'
    deciding_probe: thinking-off
    evidence:
      - {{id: E1, relation: supports, note: '{IMG}'}}
decisions:
  - kind: PARKED
    at: 2026-07-02
    by: '{SCRIPT}'
    rationale: '{HOSTILE}'
    tradeoff: '{IMG}'
    revisit_on: 2026-07-03
    triggers: [{{kind: new-build, note: '{SCRIPT}'}}]
references:
  - {{url: 'https://example.com/a', title: '{HOSTILE}', note: '{IMG}'}}
---
Body {SCRIPT} {IMG} [click](javascript:alert(1))
"""

# Elements whose text Streamlit renders as Markdown.
MARKDOWN_TYPES = {
    "markdown",
    "caption",
    "title",
    "header",
    "subheader",
    "error",
    "info",
    "success",
    "warning",
}
UNESCAPED_TAG = re.compile(r"(?<!\\)<")
SCRIPT_LINK = re.compile(r"(?<!\\)\]\(\s*javascript", re.IGNORECASE)


@pytest.fixture
def hostile_kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    path = tmp_path / f"{SLUG}.md"
    path.write_text(INCIDENT, "utf-8")
    store = Store(url)
    try:
        import_paths(store, [path])
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    monkeypatch.setenv("TRIAGE_TODAY", "2026-07-10")  # parked past its date: overdue shown
    yield url
    data.forget_stores()


def walk(node: Any) -> Iterator[Any]:
    for child in getattr(node, "children", {}).values():
        yield child
        yield from walk(child)


def markdown_text(element: Any) -> str | None:
    """The Markdown source of an element Streamlit renders as Markdown, else None."""
    kind = getattr(element, "type", "")
    if kind in MARKDOWN_TYPES:
        return str(element.proto.body)
    if kind == "expander":
        return str(element.label)
    if kind == "page_link":
        return str(element.proto.label)
    if kind == "tab":
        return str(element.label)
    return None


def assert_inert(at: AppTest) -> list[str]:
    """No element renders recorded markup; returns everything a reader sees as Markdown."""
    seen = []
    for element in walk(at.main):
        kind = getattr(element, "type", "")
        if kind == "markdown":
            assert not element.proto.allow_html, element.proto.body
        text = markdown_text(element)
        if text is not None:
            assert not UNESCAPED_TAG.search(text), (kind, text)
            assert not SCRIPT_LINK.search(text), (kind, text)
            seen.append(md_unescape(text))
        if kind == "html":
            body = element.proto.body
            assert not re.search(r"<(script|img)\b", body, re.IGNORECASE), body
            assert 'href="javascript' not in body.lower()
            seen.append(body)
    return seen


def run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page != "incidents":
        at.switch_page(f"views/{page}.py")
    at.query_params.update(query)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_incidents_page_shows_markup_as_text(hostile_kb: str) -> None:
    at = run("incidents")
    assert_inert(at)
    rows = next(df.value for df in at.dataframe if "Incident" in df.value.columns)
    assert list(rows["Title"]) == [f"Incident {SCRIPT}"]


def test_incident_page_shows_markup_as_text_everywhere(hostile_kb: str) -> None:
    at = run("incident", slug=SLUG)
    seen = assert_inert(at)
    # The reader sees the title as typed, in the heading, the expander and the table.
    assert f"Incident {SCRIPT}" in seen
    assert f"{TITLE} · untested" in seen
    causes = next(df.value for df in at.dataframe if "Deciding probe" in df.value.columns)
    assert list(causes["Title"]) == [TITLE]
    assert any(HOSTILE in text for text in seen)
    # The graph labels are quoted DOT strings (plain text to Graphviz, never HTML labels).
    [chart] = at.get("graphviz_chart")
    # (wrapped on spaces into lines: the DOT escape \n joins them)
    assert f'label="{TITLE}"'.replace(" ", "\\n") in chart.proto.spec.replace(" ", "\\n")
    assert "label=<" not in chart.proto.spec
    # Overdue marker (the revisit date passed) also escapes what it quotes.
    assert any(text.startswith("**OVERDUE**") for text in seen)


def test_decision_log_and_retrospective_show_markup_as_text(hostile_kb: str) -> None:
    at = run("decisions")
    seen = assert_inert(at)
    assert any(f"Incident {SCRIPT}" in text for text in seen)
    rows = next(df.value for df in at.dataframe if "Revisit state" in df.value.columns)
    assert rows.iloc[0]["By"] == SCRIPT

    at = run("retrospective", slug=SLUG)
    seen = assert_inert(at)
    html = next(
        element.proto.body for element in walk(at.main) if getattr(element, "type", "") == "html"
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_md_escape_round_trips_and_neutralises() -> None:
    for text in [HOSTILE, "1. list\n- item\n# heading\n> quote\n===", "a_b *c* `d` ~e~ |f|"]:
        escaped = md_escape(text)
        assert md_unescape(escaped) == text
        assert not UNESCAPED_TAG.search(escaped)
    assert md_link("docs", "javascript:alert(1)") == "docs (javascript\\:alert(1))"
    assert md_link("docs", "https://example.com/x") == "[docs](https://example.com/x)"
    assert safe_url("data:text/html,<b>") is None


def test_markdown_to_html_escapes_raw_html_and_drops_script_links() -> None:
    html = markdown_to_html(f"{SCRIPT}\n\n{IMG}\n\n[x](javascript:alert(1))\n\n|a|b|\n|-|-|\n|1|2|")
    assert "<script" not in html and "<img" not in html
    assert 'href="javascript' not in html
    assert "<table>" in html
