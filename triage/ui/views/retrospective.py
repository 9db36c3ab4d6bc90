"""Retrospective: the incident's story generated from its record, with a Markdown download."""

from __future__ import annotations

import importlib

import streamlit as st

from kb.jsontypes import JsonObject
from triage.ui import data, nav
from triage.ui.text import markdown_to_html, md_escape

store = data.get_store()


def retrospective(record: JsonObject) -> tuple[str, str]:
    """(markdown, html fragment) from kb.domain.retro, else the recorded narrative."""
    try:
        retro = importlib.import_module("kb.domain.retro")
    except ModuleNotFoundError as exc:
        if exc.name != "kb.domain.retro":
            raise
        retro = None
    generate = getattr(retro, "retro_markdown", None) or getattr(
        retro, "retrospective_markdown", None
    )
    if generate is not None:
        markdown = str(generate(record))
        renderer = getattr(retro, "markdown_renderer", None)
        # kb.domain.retro's renderer: raw HTML off, links limited to http(s)/mailto/anchors.
        html = renderer().render(markdown) if renderer else markdown_to_html(markdown)
        return markdown, html
    st.warning(
        "The retrospective generator (kb.domain.retro) is not installed in this build; "
        "showing the incident's recorded narrative instead."
    )
    markdown = f"# {record.get('title', record['slug'])}\n\n{record.get('body', '')}"
    return markdown, markdown_to_html(markdown)


slug = st.query_params.get("slug")
if not slug:
    # No incident in the address: the most recent one, not a blank page with a chooser.
    recent = data.recent_incidents(store, limit=1)
    slug = recent[0][0] if recent else None
    if slug:
        st.caption("No incident in the address: showing the most recent one.")
if not slug:
    st.title("Retrospective")
    st.info("No incidents in the knowledge base yet.")
else:
    record = data.load_incident(store, str(slug))
    if record is None:
        st.title("Retrospective")
        st.error(md_escape(f"No incident {slug!r} in the knowledge base."))
    else:
        st.page_link(
            nav.INCIDENT,
            label=md_escape(f"Back to {record['slug']}"),
            icon=":material/arrow_back:",
            query_params={"slug": record["slug"]},
        )
        markdown, html = retrospective(record)
        # To paste: Markdown with linked citations (GitHub), plain Markdown (Jira, issues,
        # wikis: no anchors) or Slack's markup (kb.domain.retro.retro_text).
        text_of = getattr(importlib.import_module("kb.domain.retro"), "retro_text", None)
        formats = ("markdown", "plain", "slack") if text_of else ("markdown",)
        fmt = st.radio("Format to paste", formats, horizontal=True, key="retro_format")
        pasted = markdown if fmt == "markdown" or text_of is None else str(text_of(record, fmt))
        st.download_button(
            "Download Markdown" if fmt == "markdown" else f"Download for {fmt}",
            pasted,
            file_name=f"{record['slug']}-retrospective{'' if fmt == 'markdown' else '-' + fmt}.md",
            mime="text/markdown",
            key="download_retro",
        )
        # markdown-it with raw HTML off escapes any markup in recorded text; st.html then
        # sanitises again (DOMPurify) and never runs scripts.
        st.html(html)
        with st.expander(f"Text to paste ({fmt})"):
            st.code(pasted, language="markdown")
