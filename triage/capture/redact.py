"""Redaction: credentials in headers, JSON bodies, URLs, free text and server flags become
markers.

Everything a capture produces passes through here before anything else sees it; a
marker carries a short keyed fingerprint (see `fingerprint`) so two captures of the same
secret can be compared within one installation.

Names are matched by pattern, not by list: a header, body key or query parameter whose
name (lower-cased, `-` and `_` dropped) holds `key`, `token`, `secret`, `auth`,
`password`, `subscription`, `cookie`, `credential`, `session` or `signature` is a
secret -- except counts and token texts (`max_tokens`, `x-ratelimit-remaining-tokens`,
`predicted_per_token_ms`, logprobs). Free text is scrubbed for provider key shapes,
`Bearer ...`, cookies, and `name=value`, `name: value` and `name value` forms.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from triage.capture.fingerprint import fingerprint

__all__ = [
    "REDACTED_PREFIX",
    "SENSITIVE_HEADERS",
    "SENSITIVE_KEYS",
    "SENSITIVE_QUERY_KEYS",
    "SECRET_SERVER_FLAGS",
    "is_secret_name",
    "redact_args",
    "redact_headers",
    "redact_json",
    "redact_text",
    "redact_url",
    "redaction_marker",
]

REDACTED_PREFIX = "[REDACTED:hmac:"
_MARKER_START = "[REDACTED:"

# Well-known credential headers (kept for callers; the name pattern below covers them).
SENSITIVE_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "cookie",
        "set-cookie",
        "x-auth-token",
        "x-goog-api-key",
        "x-amz-security-token",
        "openai-api-key",
        "ocp-apim-subscription-key",
    }
)
# Body keys compared after lower-casing and dropping '-' and '_' (so apiKey == api_key);
# always secret, even where the pattern would not say so.
SENSITIVE_KEYS = frozenset(
    {"key", "pass", "pwd", "pin", "passwd", "passphrase", "authorization", "cookie"}
)
# Query parameters that carry credentials in URLs (beyond the name pattern).
SENSITIVE_QUERY_KEYS = frozenset({"sig", "signature", "code", "auth", "key", "pass", "pwd"})

_SECRET_NAME = re.compile(
    r"key|token|secret|authori[sz]ation|auth|passw|passphrase|subscription|cookie"
    r"|credential|session"
    r"|signature"
)
_AUTHOR_WORD = re.compile(r"(?<![a-z0-9])author(?:s|ed|ity)?(?![a-z0-9])")
# Counts, timings and token texts whose names contain a secret word.
# Matched on the lower-cased name with its separators (so `key-s` is not `keys`).
_NOT_SECRET_NAME = re.compile(
    r"tokens$|tokens?[_-]?(?:count|ids?|text|logprobs?|details)$|tokeni[sz]er|rate[_-]?limit"
    r"|(?<![a-z0-9])keys$|keyword|keyboard|keyframe"
)
# Numbers under these names are secrets too (a numeric PIN or key); under `token` or
# `session` names a number is a count or an id.
_NUMERIC_SECRET_NAME = re.compile(r"key|secret|passw|passphrase|pwd|pin$|credential|^pass$")
# Subtrees that legitimately use key names like "token" for non-secret data (logprobs
# carry the sampled token text) are walked for token-shaped secrets only.
_NON_SECRET_CONTAINERS = frozenset(
    {"logprobs", "top_logprobs", "completion_probabilities", "probs", "top_probs"}
)

# Token-shaped secrets, wherever they appear in text: provider key prefixes, bearer/basic
# credentials, JWTs. A short provider key is still a key when it holds a digit or an
# upper-case letter ("sk-learn" is prose, "sk-a1b2" is not).
_TOKEN_PATTERNS = [
    re.compile(
        r"(?<![A-Za-z0-9])(?:sk|pk|rk|gsk|xai|pplx|nvapi)[_-](?:[A-Za-z0-9_\-]{12,}"
        r"|(?=[A-Za-z0-9_\-]*[0-9A-Z])[A-Za-z0-9_\-]{3,})"
    ),
    re.compile(
        r"(?<![A-Za-z0-9])(?:ghp|gho|ghu|ghs|ghr|github_pat|hf|glpat|xox[abprs]|r8)[_-]"
        r"[A-Za-z0-9_\-]{8,}"
    ),
    re.compile(r"(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![A-Za-z0-9])"),
    re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+"),
]
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(Bearer|Basic|Token|ApiKey)(\s+)([A-Za-z0-9._~+/\-]{4,}=*)")
# `Cookie session=...; other=...` (header lines pasted into messages, logs).
_COOKIE = re.compile(
    r"(?i)\b((?:set-)?cookie)([\"']?\s*:?\s*)"
    r"([A-Za-z0-9_.\-]+=[^\s;,\"']+(?:;\s*[A-Za-z0-9_.\-]+=[^\s;,\"']*)*)"
)
# `password=...`, `"api_key": "..."`, `token: ...` inside free text (curl lines, logs, error
# messages). Strong names redact any value of 4+ characters; the ambiguous `key`, `token`
# and `pass` only values that look like credentials, so prose ("the key: understand X")
# stays.
_STRONG_WORDS = (
    r"api[_-]?key|secret|passw(?:or)?d|passphrase|pwd|(?:access|refresh|auth|id|session|bearer"
    r"|api)[_-]?token(?!s)|[_-]token(?!s)|subscription[_-]?key|credentials?|private[_-]?key"
    r"|authori[sz]ation|auth"
)
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])([A-Za-z0-9_\-]*?(?:" + _STRONG_WORDS + r")[A-Za-z0-9_\-]*"
    r"|token|key|pass)"
    r"([\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;\\<>\[\]{}()]{4,})"
)
# `x-api-key VALUE`, `password hunter2`: a strong name, whitespace, then a credential-shaped
# word (with a digit, so "the secret sauce" stays).
_SPACED = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])((?:[A-Za-z0-9]+[_-])*(?:" + _STRONG_WORDS + r"))"
    r"(\s+)((?=[A-Za-z_\-.+/=]*\d)[A-Za-z0-9_\-.+/=]{6,})"
)
_WEAK_ASSIGNMENT_NAMES = frozenset({"token", "key", "pass"})
_CREDENTIAL_LIKE = re.compile(r"^(?=.*\d)[A-Za-z0-9_\-.+/=]{16,}$")
# Cheap pre-check on lower-cased text: every pattern above needs one of these.
_TRIGGERS = (
    *(
        f"{prefix}{sep}"
        for prefix in ("sk", "pk", "rk", "gsk", "xai", "pplx", "nvapi")
        for sep in "_-"
    ),
    *(
        f"{prefix}{sep}"
        for prefix in ("ghp", "gho", "ghu", "ghs", "ghr", "github_pat", "hf", "glpat", "r8")
        for sep in "_-"
    ),
    "xox", "akia", "aiza", "eyj", "bearer", "basic", "token", "key", "secret", "pass", "pwd",
    "cookie", "credential", "auth", "subscription",
)  # fmt: skip

# llama-server flags whose value is a secret (or names a file holding one).
SECRET_SERVER_FLAGS = frozenset(
    {"--api-key", "--api-key-file", "--ssl-key-file", "--hf-token", "-hft"}
)


def redaction_marker(value: str) -> str:
    """The stand-in for a secret: a marker plus a keyed fingerprint (HMAC-SHA256 under the
    installation's key), so equal secrets match within one installation."""
    return f"{REDACTED_PREFIX}{fingerprint(value)}]"


def _is_marker(value: str) -> bool:
    return value.startswith(_MARKER_START) and value.endswith("]")


@functools.lru_cache(maxsize=4096)
def _normalise_key(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """A header, body key or parameter name that carries a credential (see module doc)."""
    lowered = name.lower()
    if _normalise_key(lowered) in SENSITIVE_KEYS:
        return True
    # `author` is a word of its own, not `auth` + `or`: only the whole word is exempt, so
    # `auth-or` or `x-auth_author-key` still count as secret names.
    words = _normalise_key(_AUTHOR_WORD.sub("_", lowered))
    return bool(_SECRET_NAME.search(words)) and not _NOT_SECRET_NAME.search(lowered)


def _redact_assignment(match: re.Match[str]) -> str:
    name, sep, value = match.group(1), match.group(2), match.group(3)
    if value.startswith(_MARKER_START):
        return match.group(0)
    if _NOT_SECRET_NAME.search(name.lower()):
        return match.group(0)
    if name.lower() in _WEAK_ASSIGNMENT_NAMES and not _CREDENTIAL_LIKE.match(value):
        return match.group(0)
    return f"{name}{sep}{redaction_marker(value)}"


def _redact_spaced(match: re.Match[str]) -> str:
    name, space, value = match.group(1), match.group(2), match.group(3)
    if _NOT_SECRET_NAME.search(name.lower()):
        return match.group(0)
    return f"{name}{space}{redaction_marker(value)}"


def _redact_cookie(match: re.Match[str]) -> str:
    if _MARKER_START in match.group(3):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{redaction_marker(match.group(3))}"


def _has_trigger(text: str) -> bool:
    lowered = text.lower()
    return any(trigger in lowered for trigger in _TRIGGERS)


def redact_text(text: str) -> str:
    """Scrub token-shaped secrets, cookies and `name=secret` / `name secret` from free text."""
    if not text or not _has_trigger(text):
        return text
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: redaction_marker(m.group(0)), text)
    text = _SCHEME_CREDENTIAL.sub(
        lambda m: (
            m.group(0)
            if m.group(3).startswith("[")
            else f"{m.group(1)}{m.group(2)}{redaction_marker(m.group(3))}"
        ),
        text,
    )
    text = _COOKIE.sub(_redact_cookie, text)
    text = _ASSIGNMENT.sub(_redact_assignment, text)
    return _SPACED.sub(_redact_spaced, text)


def _redact_string_value(text: str) -> str:
    # Fast path: no secret is shorter than 4 characters.
    if len(text) < 4:
        return text
    return redact_text(text)


def _redact_secret_value(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value if _is_marker(value) or value == "" else redaction_marker(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if _NUMERIC_SECRET_NAME.search(_normalise_key(name)):
            return redaction_marker(str(value))
    return None


def redact_json(value: Any, *, _secret_keys: bool = True) -> Any:
    """A copy of a JSON value with secret fields (any depth) and token-shaped strings redacted."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            key_text = str(key)
            if _secret_keys and is_secret_name(key_text):
                replaced = _redact_secret_value(key_text, item)
                if replaced is not None:
                    out[key_text] = replaced
                    continue
            nested_keys = _secret_keys and key_text not in _NON_SECRET_CONTAINERS
            out[key_text] = redact_json(item, _secret_keys=nested_keys)
        return out
    if isinstance(value, list):
        return [redact_json(item, _secret_keys=_secret_keys) for item in value]
    if isinstance(value, str):
        return _redact_string_value(value)
    return value


def is_secret_header(name: str) -> bool:
    """A header that carries a credential: a known name or a secret-looking one."""
    return name.lower() in SENSITIVE_HEADERS or is_secret_name(name)


def _redact_header_value(name: str, value: str) -> str:
    if _is_marker(value):
        return value
    scheme, sep, credential = value.strip().partition(" ")
    if name.lower() in ("authorization", "proxy-authorization") and sep and credential.strip():
        credential = credential.strip()
        if _is_marker(credential):
            return value
        return f"{scheme} {redaction_marker(credential)}"
    return redaction_marker(value)


def redact_headers(headers: Iterable[tuple[str, str]] | Mapping[str, str]) -> dict[str, str]:
    """Headers as a dict of lower-cased names, credentials replaced by markers."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for raw_name, raw_value in items:
        name = str(raw_name).strip().lower()
        value = str(raw_value)
        if not name:
            continue
        value = _redact_header_value(name, value) if is_secret_header(name) else redact_text(value)
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def redact_url(url: str) -> str:
    """The URL with userinfo password and credential query parameters redacted."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:{redaction_marker(password)}"
        netloc = f"{userinfo}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        rebuilt = []
        for key, value in pairs:
            secret = _normalise_key(key) in SENSITIVE_QUERY_KEYS or is_secret_name(key)
            value = redaction_marker(value) if value and secret else redact_text(value)
            rebuilt.append(f"{quote(key, safe='')}={quote(value, safe='[]:')}")
        query = "&".join(rebuilt)
    rebuilt_url = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return redact_text(rebuilt_url)


def redact_args(argv: list[str]) -> list[str]:
    """Server arguments safe to record or log: the values of secret-bearing flags
    (`--api-key KEY`, `--api-key=KEY`, `--api-key-file F`, `--ssl-key-file F`, `--hf-token T`)
    become markers; every other argument is scrubbed like free text. The input is not
    modified (the caller keeps the real values, in memory only, for the server)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        text = str(arg)
        if mask_next:
            out.append(text if _is_marker(text) else redaction_marker(text))
            mask_next = False
            continue
        flag, eq, value = text.partition("=")
        if flag in SECRET_SERVER_FLAGS:
            if eq:
                out.append(f"{flag}={value if _is_marker(value) else redaction_marker(value)}")
            else:
                out.append(text)
                mask_next = True
            continue
        out.append(redact_text(text))
    return out
