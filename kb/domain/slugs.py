"""Incident slugs: ASCII by construction, so every slug matches the incident file pattern
(`YYYY-MM-DD-name`, name in `[a-z0-9]+(-[a-z0-9]+)*`) whatever the model file is called.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import date

__all__ = ["SLUG_RE", "ascii_slug", "incident_slug", "unique_incident_slug"]

SLUG_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}-[a-z0-9]+(-[a-z0-9]+)*$")
NAME_MAX = 60
SLUG_MAX = 200  # the schema's maxLength

# Letters NFKD does not decompose into ASCII plus marks.
_LETTERS = str.maketrans(
    {
        "ß": "ss",
        "ẞ": "ss",
        "æ": "ae",
        "Æ": "ae",
        "œ": "oe",
        "Œ": "oe",
        "ø": "o",
        "Ø": "o",
        "đ": "d",
        "Đ": "d",
        "ð": "d",
        "Ð": "d",
        "ł": "l",
        "Ł": "l",
        "þ": "th",
        "Þ": "th",
        "ı": "i",
        "ŋ": "ng",
        "ħ": "h",
        "ŧ": "t",
    }
)


def ascii_slug(text: str, *, fallback: str = "incident", max_length: int = NAME_MAX) -> str:
    """Lower-case ASCII words joined by '-': `Modèle-ÜBER²-qat` -> `modele-uber2-qat`.

    Accents are dropped (NFKD), compatibility forms folded (`²` -> `2`, `ﬁ` -> `fi`), a few
    letters transliterated (`ß` -> `ss`); anything else separates words. An empty result
    (say, a name in a script without a transliteration here) gives `fallback`.
    """
    folded = unicodedata.normalize("NFKD", text.translate(_LETTERS)).translate(_LETTERS)
    ascii_text = folded.encode("ascii", "ignore").decode("ascii").lower()
    words = re.findall(r"[a-z0-9]+", ascii_text)
    slug = "-".join(words)[:max_length].strip("-")
    return slug or ascii_slug(fallback, fallback="incident", max_length=max_length)


def incident_slug(opened: date, *parts: str) -> str:
    """`<opened>-<parts as one ASCII slug>`; always matches SLUG_RE."""
    name = ascii_slug("-".join(p for p in parts if p))
    return f"{opened.isoformat()}-{name}"[:SLUG_MAX].rstrip("-")


def unique_incident_slug(opened: date, *parts: str, exists: Callable[[str], bool]) -> str:
    """`incident_slug(...)`, with `-2`, `-3`, ... appended while `exists(slug)` is true."""
    base = incident_slug(opened, *parts)[: SLUG_MAX - 8].rstrip("-")
    slug, suffix = base, 2
    while exists(slug):
        slug = f"{base}-{suffix}"
        suffix += 1
    return slug
