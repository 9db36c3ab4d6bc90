"""Showing recorded (user-supplied) text safely.

Everything in the knowledge base came from someone's typing or a captured exchange, so
it is shown as text: Markdown-capable widgets get it backslash-escaped (no emphasis, no
links, no Streamlit `:colour[...]` directives, no `$...$` LaTeX, no raw HTML), and whole
Markdown documents (retrospective, narrative) are rendered by markdown-it with raw HTML
off before they reach `st.html` (which sanitises again with DOMPurify).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt

# CommonMark allows a backslash before any ASCII punctuation. These mean something anywhere
# in a line to CommonMark, GFM or Streamlit's extensions (`$` LaTeX, `:red[..]`, `~` strike).
_INLINE = re.compile(r"([\\`*_{}\[\]<>$~&|])")
# `:` starts a Streamlit directive or emoji code only when text follows it directly.
_COLON = re.compile(r":(?=\S)")
# These only start a block (heading, list, quote, rule, setext underline) at a line start.
_LINE_START = re.compile(r"^([ \t]*)(\d+(?=[.)])|[-+=#>])", re.MULTILINE)
_SAFE_URL = re.compile(r"^https?://[^\s<>()\[\]\"'`]+$", re.IGNORECASE)


def md_escape(value: Any) -> str:
    """Text that Streamlit's Markdown shows literally, line breaks kept."""
    text = _INLINE.sub(r"\\\1", str(value).replace("\r\n", "\n"))
    text = _COLON.sub(r"\\:", text)
    text = _LINE_START.sub(_escape_line_start, text)
    return text.replace("\n", "  \n")


def _escape_line_start(match: re.Match[str]) -> str:
    indent, marker = match.group(1), match.group(2)
    if marker[0].isdigit():  # "1." / "1)" starts an ordered list: escape the punctuation
        return f"{indent}{marker}\\"
    return f"{indent}\\{marker}"


def md_unescape(value: str) -> str:
    """Inverse of `md_escape` (what a reader sees), used by tests and link labels."""
    return re.sub(r"\\(.)", r"\1", value.replace("  \n", "\n"))


def safe_url(url: Any) -> str | None:
    """The URL when it is a plain http(s) link, else None (no javascript:, data:, ...)."""
    text = str(url or "").strip()
    return text if _SAFE_URL.match(text) else None


def md_link(title: Any, url: Any) -> str:
    """A Markdown link for http(s) URLs; anything else is shown as escaped text."""
    target = safe_url(url)
    label = md_escape(title or url)
    if target is None:
        return f"{label} ({md_escape(url)})" if title else label
    return f"[{label}]({target})"


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    # "js-default": CommonMark with raw HTML off and link validation (no javascript:).
    return MarkdownIt("js-default").enable("table").enable("strikethrough")


def markdown_to_html(markdown: str) -> str:
    """HTML for an untrusted Markdown document: raw HTML is escaped, unsafe links dropped."""
    return str(_markdown().render(markdown))
