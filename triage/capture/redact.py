"""Redaction: credentials in headers, JSON bodies, URLs and free text become markers.

Everything a capture produces passes through here before anything else sees it; a
marker carries a short hash so two captures of the same secret can be compared.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

__all__ = [
    "REDACTED_PREFIX",
    "SENSITIVE_HEADERS",
    "SENSITIVE_KEYS",
    "SENSITIVE_QUERY_KEYS",
    "redact_headers",
    "redact_json",
    "redact_text",
    "redact_url",
    "redaction_marker",
]

REDACTED_PREFIX = "[REDACTED:sha256:"

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
    }
)
# Header names that carry credentials by convention even when not in the list above.
_SENSITIVE_HEADER_PARTS = ("token", "secret", "api-key", "apikey", "password", "session")

# Body keys compared after lower-casing and dropping '-' and '_' (so apiKey == api_key).
SENSITIVE_KEYS = frozenset(
    {
        "apikey",
        "key",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "authtoken",
        "sessiontoken",
        "bearertoken",
        "secret",
        "clientsecret",
        "secretkey",
        "privatekey",
        "password",
        "passwd",
        "passphrase",
        "authorization",
        "cookie",
        "xapikey",
        "openaiapikey",
    }
)
# Subtrees that legitimately use key names like "token" for non-secret data (logprobs
# carry the sampled token text) are walked for token-shaped secrets only.
_NON_SECRET_CONTAINERS = frozenset(
    {"logprobs", "top_logprobs", "completion_probabilities", "probs", "top_probs"}
)
# Query parameters that carry credentials in URLs.
SENSITIVE_QUERY_KEYS = frozenset(
    {
        "apikey",
        "key",
        "token",
        "accesstoken",
        "secret",
        "password",
        "sig",
        "signature",
        "auth",
        "code",
        "clientsecret",
        "sessiontoken",
    }
)

# Token-shaped secrets, wherever they appear in text: provider key prefixes, bearer/basic
# credentials, JWTs. Prefixes need a long tail so ordinary words ("sk-learn") survive.
_TOKEN_PATTERNS = [
    re.compile(r"(?<![A-Za-z0-9])(?:sk|pk|rk)-[A-Za-z0-9_\-]{12,}"),
    re.compile(
        r"(?<![A-Za-z0-9])(?:ghp|gho|ghu|ghs|ghr|github_pat|hf|glpat|xox[abprs])[_-][A-Za-z0-9_\-]{16,}"
    ),
    re.compile(r"(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}(?![A-Za-z0-9])"),
    re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+"),
]
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(Bearer|Basic|Token|ApiKey)(\s+)([A-Za-z0-9._~+/\-]{6,}=*)")
# `password=...`, `"api_key": "..."`, `token: ...` inside free text (curl lines, logs, error
# messages). Strong names redact any value of 6+ characters; the ambiguous `key` and
# `token` only values that look like credentials, so prose ("the key: understand X") stays.
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9])([A-Za-z0-9_\-]*?(?:api[_-]?key|secret|password|passwd|"
    r"access[_-]?token|auth[_-]?token|refresh[_-]?token|session[_-]?token)|token|key)"
    r"([\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;\\<>\[\]{}()]{6,})"
)
_WEAK_ASSIGNMENT_NAMES = frozenset({"token", "key"})
_CREDENTIAL_LIKE = re.compile(r"^(?=.*\d)[A-Za-z0-9_\-.+/=]{16,}$")


def redaction_marker(value: str) -> str:
    """The stand-in for a secret: a marker plus a short hash so captures can be compared."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{REDACTED_PREFIX}{digest}]"


def _is_marker(value: str) -> bool:
    return value.startswith(REDACTED_PREFIX) and value.endswith("]")


def _redact_assignment(match: re.Match[str]) -> str:
    name, sep, value = match.group(1), match.group(2), match.group(3)
    if _is_marker(value) or value.startswith(REDACTED_PREFIX):
        return match.group(0)
    if name.lower() in _WEAK_ASSIGNMENT_NAMES and not _CREDENTIAL_LIKE.match(value):
        return match.group(0)
    return f"{name}{sep}{redaction_marker(value)}"


def redact_text(text: str) -> str:
    """Scrub token-shaped secrets and `name=secret` assignments from free text."""
    if not text:
        return text
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: redaction_marker(m.group(0)), text)
    text = _SCHEME_CREDENTIAL.sub(
        lambda m: f"{m.group(1)}{m.group(2)}{redaction_marker(m.group(3))}", text
    )
    return _ASSIGNMENT.sub(_redact_assignment, text)


def _redact_string_value(text: str) -> str:
    # Fast path: no secret is shorter than 6 characters, and most strings in a chat body
    # hold none of the substrings every pattern above needs (one regex pass in C).
    if len(text) < 6 or not _TEXT_TRIGGER.search(text):
        return text
    return redact_text(text)


_TEXT_TRIGGER = re.compile(
    r"sk-|pk-|rk-|gh[pousr][_-]|github_pat|hf[_-]|glpat|xox|akia|aiza|eyj|bearer|basic|token|key"
    r"|secret|passw",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=4096)
def _normalise_key(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def _redact_secret_value(value: Any) -> Any:
    if isinstance(value, str):
        return value if _is_marker(value) or value == "" else redaction_marker(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return redaction_marker(str(value))
    return None


def redact_json(value: Any, *, _secret_keys: bool = True) -> Any:
    """A copy of a JSON value with secret fields (any depth) and token-shaped strings redacted."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            key_text = str(key)
            if _secret_keys and _normalise_key(key_text) in SENSITIVE_KEYS:
                replaced = _redact_secret_value(item)
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


def _is_sensitive_header(name: str) -> bool:
    lowered = name.lower()
    if "ratelimit" in lowered:  # x-ratelimit-remaining-tokens is a count, not a credential
        return False
    return lowered in SENSITIVE_HEADERS or any(p in lowered for p in _SENSITIVE_HEADER_PARTS)


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
        value = (
            _redact_header_value(name, value) if _is_sensitive_header(name) else redact_text(value)
        )
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
            if value and _normalise_key(key) in SENSITIVE_QUERY_KEYS:
                value = redaction_marker(value)
            else:
                value = redact_text(value)
            rebuilt.append(f"{quote(key, safe='')}={quote(value, safe='[]:')}")
        query = "&".join(rebuilt)
    rebuilt_url = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return redact_text(rebuilt_url)
