"""Built-in check on the text's encoding: mojibake.

Degraded decoding (a quantized KV cache, broken byte-fallback tokens) shows as UTF-8 read as
Latin-1/cp1252 ("lÃ©ger" for "léger", "Â°" for "°") or as U+FFFD replacement characters in
the visible output. A run counts only when it decodes back to valid UTF-8, so legitimate
accented text ("São Paulo", "Ã" alone) is not flagged.
"""

from __future__ import annotations

import json
import re

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _no_completion_reason, _pass, check

KIND = "mojibake"
MAX_CHARS = 200_000  # scanned per field
# A UTF-8 lead byte as Latin-1 (C2-F4) followed by continuation bytes as Latin-1 (80-BF) or
# as the characters cp1252 puts at 80-9F.
_CP1252_HIGH = "\u20ac\u201a\u0192\u201e\u2026\u2020\u2021\u02c6\u2030\u0160\u2039\u0152\u017d"
_CP1252_HIGH += (
    "\u2018\u2019\u201c\u201d\u2022\u2013\u2014\u02dc\u2122\u0161\u203a\u0153\u017e\u0178"
)
_CANDIDATE = re.compile(f"[\u00c2-\u00f4][\u0080-\u00bf{_CP1252_HIGH}]{{1,3}}")


def _decodes(run: str) -> bool:
    for codec in ("cp1252", "latin-1"):
        try:
            decoded = run.encode(codec).decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            continue
        return decoded != run
    return False


def mojibake_runs(text: str) -> list[str]:
    """The mojibake sequences in `text` (U+FFFD counts as one)."""
    text = text[:MAX_CHARS]
    runs = [m.group(0) for m in _CANDIDATE.finditer(text) if _decodes(m.group(0))]
    return runs + ["\ufffd"] * text.count("\ufffd")


def _fields(view: View) -> list[tuple[str, str]]:
    fields = []
    for choice in view.choices:
        fields.append((choice.content, choice.content_path))
        for index, call in enumerate(choice.tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            args = function.get("arguments") if isinstance(function, dict) else None
            if args is not None:
                text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                fields.append((text, f"{choice.path}.tool_calls[{index}].function.arguments"))
    return fields


@check(KIND, number=17)
def check_mojibake(view: View) -> list[Finding]:
    """Content or tool-call arguments hold mis-decoded UTF-8 or replacement characters."""
    if not view.choices:
        return _pass(KIND, _no_completion_reason(view))
    findings = []
    for text, where in _fields(view):
        runs = mojibake_runs(text)
        if not runs:
            continue
        shown = ", ".join(repr(r) for r in runs[:3])
        score = min(1.0, len(runs) / 3)
        findings.append(
            Finding(
                KIND, False, round(score, 4), f"{len(runs)} mis-decoded sequence(s): {shown}", where
            )
        )
    return findings or _pass(KIND, "no mis-decoded text in content or tool arguments")


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's check to the catalogue."""
    catalogue.checks.add(check_mojibake)
