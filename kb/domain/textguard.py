"""Free text on its way into the knowledge base: size bounds, valid Unicode, and secret
phrases redacted.

Titles, summaries, rationales, notes and descriptions are typed by people (or pasted from
chat, tickets and logs), so they carry what people write: "the password is hunter2",
"token: ghp_...", "api key sk-...". Such phrases are replaced by a plain `[REDACTED]`
marker before the row is written -- no hash or fingerprint of the value is kept, so a
reader of the database cannot confirm a guessed secret. Prose around the words stays:
"the api key is missing", "the stop token is <eos>", "token count" are not touched.

kb depends on nothing in triage/, so this is its own small rule set (the capture
redaction in triage/capture/redact.py handles headers and JSON bodies of exchanges).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["REDACTED", "TextLimit", "check_text", "redact_secret_phrases", "shorten"]

REDACTED = "[REDACTED]"

# Nouns whose value is always a secret, whatever connects them to it.
_STRONG = (
    r"pass(?:word|wd|phrase|code)|pwd|secret(?:[ _-]?key)?|client[ _-]?secret"
    r"|api[ _-]?key|access[ _-]?key|private[ _-]?key|secret[ _-]?access[ _-]?key"
    r"|(?:access|auth|bearer|refresh|session|api|github|hf|slack|bot|personal[ _-]access)"
    r"[ _-]?token|credentials?|pin[ _-]?(?:code|number)"
)
# Nouns that are also ordinary words in this domain ("the stop token is <eos>", "key
# findings"): their value is redacted only when it looks like a credential.
_WEAK = r"token|key"
_CONNECTOR = r"(?:\s*[:=]\s*|\s+(?:is|was|=|:|are|were|reads|equals|(?:is\s+)?set\s+to)\s+)"
_VALUE = r"(?:\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|`[^`\n]{1,200}`|[^\s\"'`,;)\]}]{1,200})"
_PHRASE = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?P<noun>(?:" + _STRONG + r")|(?:" + _WEAK + r"))"
    r"(?P<sep>" + _CONNECTOR + r"|\s+)(?P<value>" + _VALUE + r")"
)
# A cheap pre-check on lower-cased text: every phrase needs one of these.
_TRIGGERS = ("pass", "pwd", "secret", "key", "token", "credential", "pin")
_WEAK_NOUNS = frozenset({"token", "key"})
# Words that follow "password is" in prose, not a password.
_ORDINARY = frozenset(
    """a an the not no none null nil empty blank missing wrong invalid incorrect correct
    valid expired revoked required needed set unset ok okay fine rejected accepted leaked
    rotated changed reset same different short long weak strong this that it its here there
    in on at of for from with by being still now too also only never always used shown
    logged stored sent printed given known unknown redacted hidden masked required
    mandatory optional present absent correctly exposed supplied provided configured
    ignored checked verified case-sensitive out safe public private secret secure""".split()
)
# A digit and a letter in one word of 6+ characters, or a long unbroken string.
_CREDENTIAL_LIKE = re.compile(
    r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_\-.+/=~!@#$%^&*]{6,}$|^[A-Za-z0-9_\-.+/=~]{20,}$"
)
_PLAIN_WORD_SUFFIX = re.compile(r"^[a-z]+(?:ed|ing|ly|able|ible)$")


def _strip(value: str) -> str:
    if len(value) >= 2 and value[0] in "\"'`" and value[-1] == value[0]:
        return value[1:-1]
    return value.rstrip(".!?:")


def _is_ordinary(word: str) -> bool:
    lowered = word.lower()
    return (
        lowered in _ORDINARY
        or bool(_PLAIN_WORD_SUFFIX.match(lowered))
        or lowered.startswith(REDACTED.lower()[:9])
        or lowered.startswith("[redacted")
    )


def _keep(noun: str, sep: str, value: str) -> bool:
    """Whether the word after a secret noun is prose, not the secret."""
    if _CREDENTIAL_LIKE.match(value):
        return False
    if noun.lower() in _WEAK_NOUNS:
        # "token: 151645", "the stop token is <eos>", "the key: understand X": only
        # credential-shaped values after the ambiguous nouns.
        return True
    if not sep.strip():  # "password hunter2", "pin code 1234"; not "password reset"
        return not (value.isdigit() and len(value) >= 4)
    explicit = sep.strip() in (":", "=")
    return not explicit and _is_ordinary(value)  # "the password is wrong"


def _replace(match: re.Match[str]) -> str:
    noun, sep, raw = match.group("noun"), match.group("sep"), match.group("value")
    quoted = raw[:1] in "\"'`"
    value = _strip(raw)
    trailing = "" if quoted else raw[len(raw.rstrip(".!?:")) :]
    if not value or value.lower().startswith("[redacted") or _keep(noun, sep, value):
        return match.group(0)
    return f"{noun}{sep}{REDACTED}{trailing}"


def redact_secret_phrases(text: str) -> str:
    """`text` with the values of secret phrases ("password is X", "token: X", "api key X",
    "secret=X") replaced by `[REDACTED]`; everything else unchanged."""
    if not text:
        return text
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    return _PHRASE.sub(_replace, text)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class TextLimit:
    """The bound of one free-text field, named as the user knows it (`incident.title`)."""

    field: str
    max_chars: int


def check_text(limit: TextLimit, value: str) -> None:
    """Raise ValueError naming the field: over its bound, or not valid Unicode (a lone
    surrogate, e.g. from `\\ud800` in JSON or undecodable bytes in an argument)."""
    if len(value) > limit.max_chars:
        raise ValueError(f"{limit.field}: {len(value):,} characters, at most {limit.max_chars:,}")
    found = _SURROGATE.search(value)
    if found is not None:
        raise ValueError(
            f"{limit.field}: not valid Unicode (a lone surrogate U+{ord(found.group()):04X} at "
            f"character {found.start() + 1})"
        )


def shorten(text: str, width: int) -> str:
    """One line of at most `width` characters, for listings ("..." marks a cut)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(0, width - 3)].rstrip() + "..."
