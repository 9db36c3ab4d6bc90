"""Retrospective: the incident's story generated from its record, with a Markdown download."""

from __future__ import annotations

import streamlit as st

from kb.domain.retro import retro_markdown
from kb.domain.retroformat import FORMATS, markdown_renderer, retro_text
from kb.jsontypes import JsonObject
from triage.ui import data, nav
from triage.ui.text import md_escape

store = data.get_store()


def retrospective(record: JsonObject) -> tuple[str, str]:
    """(markdown, html fragment) of the record's retrospective (kb.domain.retro); the HTML
    from kb.domain.retroformat's renderer: raw HTML off, links limited to http(s)/mailto/
    in-page anchors."""
    markdown = retro_markdown(record)
    return markdown, markdown_renderer().render(markdown)


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
        # wikis: no anchors) or Slack's markup (kb.domain.retroformat.retro_text).
        fmt = st.radio("Format to paste", FORMATS, horizontal=True, key="retro_format")
        pasted = markdown if fmt == "markdown" else retro_text(record, fmt)
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
