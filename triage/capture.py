"""Ingest a failing exchange: JSON pair, curl command, SSE transcript, HAR 1.2, JSONL.

Every input becomes an `Exchange`: the chat request, the (re-assembled) response and the
transport facts, validated against `kb/schemas/exchange.schema.json` and redacted before
anything else sees it. Parsers raise `CaptureError(file, location, message)` and nothing
else, whatever the input.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import jsonschema
from jsonschema.exceptions import best_match

__all__ = [
    "FORMATS",
    "MAX_CAPTURE_BYTES",
    "CaptureError",
    "Exchange",
    "detect_format",
    "exchange_from_http",
    "load_file",
    "parse",
    "parse_curl",
    "parse_har",
    "parse_jsonl",
    "parse_pair",
    "parse_pair_document",
    "parse_sse",
    "read_file",
    "redact_headers",
    "redact_json",
    "redact_text",
    "redact_url",
    "redaction_marker",
    "validate_exchange",
]

FORMATS = ("pair", "curl", "sse", "har", "jsonl")
SCHEMA_VERSION = 1

# A capture is one exchange or a log of them; 32 MiB is far above any real chat exchange
# and keeps a mistaken `capture core.dump` from filling memory and the database.
MAX_CAPTURE_BYTES = 32 * 1024 * 1024
# Chat bodies nest a handful of levels (tool schemas a few more); a hard cap keeps the
# recursive walks below (redaction, validation) far from Python's recursion limit.
MAX_JSON_DEPTH = 100
# Non-JSON bodies (an HTML proxy page, a plain-text 500) are kept only as a readable excerpt.
MAX_RESPONSE_TEXT_CHARS = 8192


class CaptureError(Exception):
    """Input that is not a valid capture; names the file and where in it (line or JSON path)."""

    def __init__(self, file: str, location: int | str | None, message: str) -> None:
        self.file = file
        self.location = location
        # Messages may quote input; scrub them like everything else that is shown.
        self.message = redact_text(message)
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.location is None or self.location == "":
            return f"{self.file}: {self.message}"
        if isinstance(self.location, int):
            return f"{self.file}:{self.location}: {self.message}"
        return f"{self.file}: {self.location}: {self.message}"


# --------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# The exchange
# --------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """One chat request and its response, normalised and redacted, with transport facts."""

    request: dict[str, Any]
    response: dict[str, Any] | None
    source_format: str
    source_file: str
    sha256: str
    index: int = 0
    location: str | None = None
    status: int | None = None
    elapsed_ms: float | None = None
    truncated: bool = False
    timed_out: bool = False
    stream: bool = False
    error: dict[str, Any] | None = None
    response_text: str | None = None
    url: str | None = None
    method: str | None = None
    request_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    http_timings: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored as evidence (validates against exchange.schema.json)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "request": self.request,
            "response": self.response,
            "response_text": self.response_text,
            "error": self.error,
            "status": self.status,
            "elapsed_ms": self.elapsed_ms,
            "truncated": self.truncated,
            "timed_out": self.timed_out,
            "stream": self.stream,
            "url": self.url,
            "method": self.method,
            "request_headers": self.request_headers,
            "response_headers": self.response_headers,
            "http_timings": self.http_timings,
            "source_format": self.source_format,
            "source_file": self.source_file,
            "sha256": self.sha256,
            "index": self.index,
            "location": self.location,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Exchange:
        """Rebuild an exchange from its stored form (validated first)."""
        errors = validate_exchange(data)
        if errors:
            raise CaptureError("<exchange>", errors[0][0], errors[0][1])
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


@functools.lru_cache(maxsize=1)
def _exchange_validator() -> jsonschema.protocols.Validator:
    import kb

    path = Path(kb.__file__).parent / "schemas" / "exchange.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate_exchange(data: Any) -> list[tuple[str, str]]:
    """Schema violations of an exchange dict as (json_path, message); empty when valid."""
    validator = _exchange_validator()
    errors = list(validator.iter_errors(data))
    if not errors:
        return []
    best = best_match(errors)
    ordered = [best] + [e for e in errors if e is not best]
    return [(e.json_path, e.message[:300]) for e in ordered]


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(func: _F) -> _F:
    """Parsers raise CaptureError and nothing else, whatever the input."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CaptureError:
            raise
        except RecursionError:
            raise CaptureError(_file_arg(args, kwargs), None, "input nests too deeply") from None
        except Exception as exc:  # noqa: BLE001 -- the contract: only CaptureError escapes
            # The exception text may quote the input; name only its type.
            raise CaptureError(
                _file_arg(args, kwargs), None, f"cannot read capture ({type(exc).__name__})"
            ) from None

    return wrapper  # type: ignore[return-value]


def _file_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    file = kwargs.get("file")
    return str(file) if file else "<input>"


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for i, part in enumerate(parts):
        if i:
            digest.update(b"\0")
        digest.update(part)
    return digest.hexdigest()


def _decode(data: bytes | str, file: str) -> tuple[str, bytes]:
    """Text and raw bytes of an input, enforcing the size limit and strict UTF-8."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CaptureError(
                file, None, f"text holds unpaired surrogates at char {exc.start}"
            ) from None
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        raise CaptureError(file, None, f"expected bytes or text, got {type(data).__name__}")
    if len(raw) > MAX_CAPTURE_BYTES:
        raise CaptureError(
            file,
            None,
            f"file is {len(raw)} bytes, over the {MAX_CAPTURE_BYTES} byte limit (32 MiB)",
        )
    if isinstance(data, str):
        text = data
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise CaptureError(
                file, line, f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
            ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise CaptureError(file, line, "NUL byte in a text capture (binary file?)")
    return text, raw


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str, file: str, line_offset: int = 0, what: str = "JSON") -> Any:
    """json.loads with errors that name the line and column."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise CaptureError(
            file, exc.lineno + line_offset, f"invalid {what}: {exc.msg} (column {exc.colno})"
        ) from None
    except RecursionError:
        raise CaptureError(
            file, line_offset + 1 if line_offset else None, f"{what} nests too deeply"
        ) from None
    except ValueError as exc:
        raise CaptureError(
            file, line_offset + 1 if line_offset else None, f"invalid {what}: {exc}"
        ) from None
    _check_depth(value, file)
    return value


def _check_depth(value: Any, file: str) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise CaptureError(file, None, f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _lines_before(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


def _normalise_error(raw: Any, *, in_stream: bool) -> dict[str, Any]:
    """llama-server / OpenAI error objects (and bare strings) as {message, type, code}."""
    if isinstance(raw, dict):
        message = raw.get("message")
        if not isinstance(message, str):
            message = json.dumps(raw, ensure_ascii=False)[:2000]
        code = raw.get("code")
        if not isinstance(code, (int, str)) or isinstance(code, bool):
            code = None
        err_type = raw.get("type")
        return {
            "message": redact_text(message),
            "type": err_type if isinstance(err_type, str) else None,
            "code": code,
            "in_stream": in_stream,
        }
    message = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)[:2000]
    return {"message": redact_text(message), "type": None, "code": None, "in_stream": in_stream}


def _status_from_error(error: dict[str, Any]) -> int | None:
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


_CURL_TIMEOUT = re.compile(r"curl: \(28\)|operation timed out|timed out after", re.IGNORECASE)


@dataclass
class _Body:
    """What a response body turned into."""

    response: dict[str, Any] | None = None
    response_text: str | None = None
    error: dict[str, Any] | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    timed_out: bool = False
    stream: bool = False


_HTTP_STATUS_LINE = re.compile(r"^HTTP/\d(?:\.\d)?\s+(\d{3})(?:\s.*)?$")


def _split_http_head(text: str, file: str) -> tuple[int | None, dict[str, str], str, int]:
    """`curl -i` output: status line and headers, then the body (skips 1xx blocks)."""
    status: int | None = None
    headers: list[tuple[str, str]] = []
    consumed_lines = 0
    rest = text
    while True:
        match = _HTTP_STATUS_LINE.match(rest.split("\n", 1)[0].rstrip("\r"))
        if not match:
            break
        status = int(match.group(1))
        headers = []
        head, sep, body = _partition_head(rest)
        for line in head.splitlines()[1:]:
            name, colon, value = line.partition(":")
            if colon:
                headers.append((name.strip(), value.strip()))
        consumed_lines += head.count("\n") + sep.count("\n")
        rest = body
        if not (100 <= status < 200):
            break
    return status, redact_headers(headers), rest, consumed_lines


def _partition_head(text: str) -> tuple[str, str, str]:
    match = re.search(r"\r?\n\r?\n", text)
    if not match:
        return text, "", ""
    return text[: match.start()], match.group(0), text[match.end() :]


def _looks_like_sse(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        return (
            stripped.startswith(("data:", "event:", "error:", "id:", "retry:"))
            or stripped == ":"
            or stripped.startswith(": ")
        )
    return False


def _parse_body(
    text: str,
    file: str,
    *,
    status: int | None = None,
    line_offset: int = 0,
    path: str | None = None,
) -> _Body:
    """A response body in any form: JSON, SSE, `curl -i` head + body, or plain text.

    `line_offset` counts the lines before the body in its file; `path` (a JSON path, used
    when the body is a string inside a JSON document) names where errors point instead.
    """
    if _HTTP_STATUS_LINE.match(text.lstrip().split("\n", 1)[0].rstrip("\r")):
        stripped = text.lstrip()
        skipped = _lines_before(text, len(text) - len(stripped))
        head_status, headers, rest, consumed = _split_http_head(stripped, file)
        if rest.strip():
            body = _parse_body(
                rest,
                file,
                status=head_status or status,
                line_offset=line_offset + skipped + consumed,
                path=path,
            )
        elif head_status is not None and head_status >= 400:
            body = _Body(
                error={
                    "message": f"HTTP {head_status} with an empty body",
                    "type": None,
                    "code": head_status,
                    "in_stream": False,
                }
            )
        else:
            raise CaptureError(
                file, path or line_offset + 1, "response has HTTP headers but no body"
            )
        body.headers = {**headers, **body.headers}
        if body.status is None:
            body.status = head_status
        return body
    if not text.strip():
        raise CaptureError(
            file, path or (line_offset + 1 if line_offset else None), "empty response"
        )
    if _looks_like_sse(text):
        return _reassemble_sse(text, file, line_offset=line_offset, status=status)
    stripped = text.strip()
    location: int | str = path or line_offset + 1
    if stripped[0] in "{[":
        try:
            value = json.loads(stripped, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            value = None
            if status is None or status < 400:
                if path is not None:
                    raise CaptureError(file, path, "response is not valid JSON") from None
                _loads(text, file, line_offset, "JSON response")  # raises with the position
        if value is not None:
            _check_depth(value, file)
            prefix = path or ("$" if line_offset == 0 else f"line {line_offset + 1}, $")
            return _json_body(value, file, status=status, path=prefix)
    # Plain text: an error page, a curl failure message, a crashed server's "Unknown Exception".
    excerpt = redact_text(stripped[:MAX_RESPONSE_TEXT_CHARS])
    if _CURL_TIMEOUT.search(stripped[:2000]):
        return _Body(response_text=excerpt, timed_out=True, status=status)
    if status is not None and status >= 400:
        return _Body(
            response_text=excerpt,
            error={"message": excerpt[:2000], "type": None, "code": status, "in_stream": False},
            status=status,
        )
    raise CaptureError(
        file, location, "response is neither JSON nor an SSE stream (and no HTTP error status)"
    )


def _json_body(value: Any, file: str, *, status: int | None, path: str) -> _Body:
    """A JSON response body; `path` is where it sits (`$`, `line 3, $.response`)."""
    if not isinstance(value, dict):
        if status is not None and status >= 400:
            return _Body(
                response=None,
                response_text=redact_text(json.dumps(value)[:MAX_RESPONSE_TEXT_CHARS]),
                error=_normalise_error(value, in_stream=False),
                status=status,
            )
        raise CaptureError(file, path, f"response must be a JSON object, got {_json_type(value)}")
    response = redact_json(value)
    if value.get("error") is not None or (status is not None and status >= 400):
        raw_error = value.get("error", value.get("detail", value))
        error = _normalise_error(raw_error, in_stream=False)
        return _Body(response=response, error=error, status=status or _status_from_error(error))
    choices = value.get("choices")
    if choices is None:
        raise CaptureError(file, path, "response has no `choices` (and is not an HTTP error body)")
    _check_choices(choices, file, path)
    return _Body(response=response, status=status)


def _check_choices(choices: Any, file: str, path: str) -> None:
    def where(suffix: str) -> str:
        return f"{path}.choices{suffix}"

    if not isinstance(choices, list):
        raise CaptureError(
            file, where(""), f"`choices` must be an array, got {_json_type(choices)}"
        )
    if not choices:
        raise CaptureError(file, where(""), "`choices` is empty")
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise CaptureError(file, where(f"[{i}]"), "a choice must be an object")
        message = choice.get("message", choice.get("delta"))
        if message is None and isinstance(choice.get("text"), str):
            continue
        if not isinstance(message, dict):
            raise CaptureError(file, where(f"[{i}].message"), "choice has no message object")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise CaptureError(
                file, where(f"[{i}].message.tool_calls"), "tool_calls must be an array"
            )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _request_body(value: Any, file: str, location: str | int | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaptureError(
            file, location, f"request must be a JSON object, got {_json_type(value)}"
        )
    redacted: dict[str, Any] = redact_json(value)
    return redacted


def _finish(exchange: Exchange, file: str) -> Exchange:
    """Validate against the schema; a violation here is reported like any bad input."""
    errors = validate_exchange(exchange.to_dict())
    if errors:
        json_path, message = errors[0]
        where = f"{exchange.location}, {json_path}" if exchange.location else json_path
        raise CaptureError(file, where, f"not a valid exchange: {message}")
    return exchange


def _display_name(file: str) -> str:
    return Path(file).name or file


# --------------------------------------------------------------------------------------
# SSE
# --------------------------------------------------------------------------------------


@dataclass
class _ChoiceState:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None


def _merge_tool_call(state: _ChoiceState, delta: Any, position: int) -> None:
    if not isinstance(delta, dict):
        return
    index = delta.get("index", position)
    if not isinstance(index, int) or isinstance(index, bool):
        index = position
    call = state.tool_calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str) and delta["id"] and not call["id"]:
        call["id"] = delta["id"]
    if isinstance(delta.get("type"), str):
        call["type"] = delta["type"]
    function = delta.get("function")
    if isinstance(function, dict):
        name = function.get("name")
        if isinstance(name, str) and name:
            current = call["function"]["name"]
            # OpenAI sends the name once; some servers resend it whole in later chunks.
            if not current or name.startswith(current):
                call["function"]["name"] = name
            elif name != current:
                call["function"]["name"] = current + name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["function"]["arguments"] += arguments
        elif isinstance(arguments, (dict, list)):
            call["function"]["arguments"] += json.dumps(arguments, ensure_ascii=False)


@dataclass
class _StreamState:
    choices: dict[int, _ChoiceState] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    usage: Any = None
    timings: Any = None
    verbose: Any = None
    done: bool = False
    error: dict[str, Any] | None = None
    chunks: int = 0
    cut_mid_event: bool = False

    def apply(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        for key in ("id", "model", "created", "system_fingerprint"):
            if key in chunk and key not in self.meta:
                self.meta[key] = chunk[key]
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        if chunk.get("timings") is not None:
            self.timings = chunk["timings"]
        if "__verbose" in chunk and self.verbose is None:
            self.verbose = chunk["__verbose"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            if not isinstance(index, int) or isinstance(index, bool):
                index = position
            state = self.choices.setdefault(index, _ChoiceState())
            delta: dict[str, Any] = {}
            for key in ("delta", "message"):  # a final chunk may carry a whole message
                if isinstance(choice.get(key), dict):
                    delta = choice[key]
                    break
            if isinstance(choice.get("text"), str):  # /v1/completions streams
                state.content.append(choice["text"])
            if isinstance(delta.get("role"), str):
                state.role = delta["role"]
            if isinstance(delta.get("content"), str):
                state.content.append(delta["content"])
            reasoning = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(reasoning, str):
                state.reasoning.append(reasoning)
            tool_calls = delta.get("tool_calls")
            if isinstance(tool_calls, list):
                for pos, call in enumerate(tool_calls):
                    _merge_tool_call(state, call, pos)
            if isinstance(choice.get("finish_reason"), str):
                state.finish_reason = choice["finish_reason"]

    def response(self) -> dict[str, Any] | None:
        if not self.choices:
            return None
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message: dict[str, Any] = {"role": state.role, "content": "".join(state.content)}
            reasoning = "".join(state.reasoning)
            if reasoning:
                message["reasoning_content"] = reasoning
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
            choices.append(
                {"index": index, "message": message, "finish_reason": state.finish_reason}
            )
        response: dict[str, Any] = {"object": "chat.completion", **self.meta, "choices": choices}
        if self.usage is not None:
            response["usage"] = self.usage
        if self.timings is not None:
            response["timings"] = self.timings
        if self.verbose is not None:
            response["__verbose"] = self.verbose
        return response


def _reassemble_sse(
    text: str, file: str, *, line_offset: int = 0, status: int | None = None
) -> _Body:
    state = _StreamState()
    lines = text.splitlines()
    event_name: str | None = None
    data_lines: list[tuple[int, str]] = []
    events = 0

    def dispatch(at_eof: bool) -> None:
        nonlocal event_name, data_lines, events
        if not data_lines:
            event_name = None
            return
        events += 1
        first_line = data_lines[0][0]
        payload = "\n".join(d for _, d in data_lines)
        if len(data_lines) > 1:
            # Logs often lose the blank line between events: try the lines one by one.
            try:
                values = [json.loads(payload, parse_constant=_reject_constant)]
            except (ValueError, RecursionError):
                values = []
                for number, item in data_lines:
                    _handle(item, number, is_last=at_eof and number == data_lines[-1][0])
                data_lines = []
                event_name = None
                return
            _handle_value(values[0], first_line)
        else:
            _handle(payload, first_line, is_last=at_eof)
        data_lines = []
        event_name = None

    def _handle(payload: str, number: int, *, is_last: bool) -> None:
        stripped = payload.strip()
        if stripped == "[DONE]":
            state.done = True
            return
        if not stripped:
            return
        try:
            value = json.loads(stripped, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            if is_last:
                # The capture stops inside the last chunk: a stream cut off mid-event.
                state.cut_mid_event = True
                return
            if event_name == "error":
                state.error = _normalise_error(stripped, in_stream=True)
                return
            raise CaptureError(file, number, "SSE data is not JSON") from None
        _check_depth(value, file)
        _handle_value(value, number)

    def _handle_value(value: Any, number: int) -> None:
        if not isinstance(value, dict):
            raise CaptureError(
                file, number, f"SSE data must be a JSON object, got {_json_type(value)}"
            )
        if event_name == "error" or ("error" in value and value["error"] is not None):
            state.error = _normalise_error(value.get("error", value), in_stream=True)
            return
        state.apply(value)

    for number, raw_line in enumerate(lines, start=1 + line_offset):
        line = raw_line.rstrip("\r")
        if not line.strip():
            dispatch(at_eof=False)
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive ping
        name, colon, value = line.partition(":")
        if not colon:
            name, value = line, ""
        elif value.startswith(" "):
            value = value[1:]
        name = name.strip()
        if name == "data":
            data_lines.append((number, value))
        elif name == "event":
            event_name = value.strip()
        elif name == "error":
            # Older llama-server builds: a bare `error:` field instead of `data: {"error": ...}`.
            events += 1
            try:
                raw = json.loads(value, parse_constant=_reject_constant)
            except (ValueError, RecursionError):
                raw = value
            if isinstance(raw, dict) and "error" in raw:
                raw = raw["error"]
            state.error = _normalise_error(raw, in_stream=True)
    dispatch(at_eof=True)

    if events == 0:
        raise CaptureError(
            file, line_offset + 1 if line_offset else None, "SSE transcript has no data events"
        )
    if not state.choices and state.error is None and not state.cut_mid_event:
        if state.done and state.chunks == 0:
            raise CaptureError(file, None, "SSE transcript holds only [DONE], no chunks")
        raise CaptureError(file, None, "SSE transcript has no chat completion chunks")
    response = state.response()
    finished = any(c.finish_reason for c in state.choices.values())
    truncated = state.error is None and (state.cut_mid_event or not (state.done or finished))
    return _Body(
        response=redact_json(response) if response is not None else None,
        error=state.error,
        status=status,
        truncated=truncated,
        stream=True,
    )


# --------------------------------------------------------------------------------------
# Public parsers
# --------------------------------------------------------------------------------------


def _exchange_from_body(
    request: dict[str, Any],
    body: _Body,
    *,
    source_format: str,
    file: str,
    sha256: str,
    index: int = 0,
    location: str | None = None,
    status: int | None = None,
    elapsed_ms: float | None = None,
    timed_out: bool = False,
    truncated: bool = False,
    url: str | None = None,
    method: str | None = None,
    request_headers: dict[str, str] | None = None,
    response_headers: dict[str, str] | None = None,
    http_timings: dict[str, float] | None = None,
) -> Exchange:
    final_status = status if status is not None else body.status
    if final_status is None and body.error is not None and not body.error.get("in_stream"):
        # A streamed error arrives after a 200 status line; only a plain error body tells
        # the HTTP status through its code.
        final_status = _status_from_error(body.error)
    exchange = Exchange(
        request=request,
        response=body.response,
        response_text=body.response_text,
        error=body.error,
        status=final_status,
        elapsed_ms=elapsed_ms,
        truncated=truncated or body.truncated,
        timed_out=timed_out or body.timed_out,
        stream=body.stream,
        url=redact_url(url) if url else None,
        method=method.upper() if method else None,
        request_headers=request_headers or {},
        response_headers={**body.headers, **(response_headers or {})},
        http_timings=http_timings,
        source_format=source_format,
        source_file=_display_name(file),
        sha256=sha256,
        index=index,
        location=location,
    )
    return _finish(exchange, file)


@_guarded
def parse_pair(
    request: bytes | str | None,
    response: bytes | str,
    *,
    file: str = "<pair>",
    request_file: str | None = None,
    status: int | None = None,
) -> Exchange:
    """A request body and a response body (JSON, SSE or `curl -i` output) as one exchange."""
    response_file = file
    request_file = request_file or file
    response_text, response_raw = _decode(response, response_file)
    if request is not None:
        request_text, request_raw = _decode(request, request_file)
        if not request_text.strip():
            raise CaptureError(request_file, None, "empty request file")
        request_body = _request_body(
            _loads(request_text, request_file, what="JSON request"), request_file, "$"
        )
        digest = _sha256(request_raw, response_raw)
    else:
        request_body, digest = {}, _sha256(response_raw)
    body = _parse_body(response_text, response_file, status=status)
    return _exchange_from_body(
        request_body, body, source_format="pair", file=response_file, sha256=digest, status=status
    )


def _transport_number(value: Any, file: str, location: str, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CaptureError(file, location, f"`{name}` must be a non-negative number")
    return float(value)


def _exchange_from_record(
    record: Any, file: str, *, sha256: str, index: int, line: int | None, source_format: str
) -> Exchange:
    """One {"request":..., "response":..., status, elapsed_ms, ...} record."""

    def where(json_path: str) -> str:
        return json_path if line is None else f"line {line}, {json_path}"

    if not isinstance(record, dict):
        raise CaptureError(
            file, line, f"an exchange record must be a JSON object, got {_json_type(record)}"
        )
    if "request" not in record:
        raise CaptureError(file, where("$.request"), "record has no `request`")
    if "response" not in record:
        raise CaptureError(file, where("$.response"), "record has no `response`")
    request = _request_body(record["request"], file, where("$.request"))
    status = record.get("status", record.get("status_code"))
    if status is not None and (
        isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 999
    ):
        raise CaptureError(file, where("$.status"), "`status` must be an HTTP status code")
    if status == 0:
        status = None
    elapsed = _transport_number(record.get("elapsed_ms"), file, where("$.elapsed_ms"), "elapsed_ms")
    timed_out = record.get("timed_out") is True
    raw_error = record.get("error")
    if isinstance(raw_error, str) and re.search(r"time(d)?[ _-]?out", raw_error, re.IGNORECASE):
        timed_out = True
    raw_response = record["response"]
    if raw_response is None or raw_response == "":
        if not timed_out and raw_error is None and status is None:
            raise CaptureError(
                file,
                where("$.response"),
                "no response, and no status, error or timeout to explain it",
            )
        # A timeout explains the missing body; its error text is not a server error.
        explained = raw_error is not None and not timed_out
        body = _Body(error=_normalise_error(raw_error, in_stream=False) if explained else None)
        if status is not None and status >= 400 and body.error is None:
            body.error = {
                "message": f"HTTP {status}",
                "type": None,
                "code": status,
                "in_stream": False,
            }
    elif isinstance(raw_response, str):
        body = _parse_body(raw_response, file, status=status, path=where("$.response"))
    else:
        _check_depth(raw_response, file)
        body = _json_body(raw_response, file, status=status, path=where("$.response"))
    if body.error is None and raw_error is not None and not timed_out:
        body.error = _normalise_error(raw_error, in_stream=False)
    headers = record.get("request_headers", record.get("headers"))
    response_headers = record.get("response_headers")
    url = record.get("url")
    method = record.get("method")
    return _exchange_from_body(
        request,
        body,
        source_format=source_format,
        file=file,
        sha256=sha256,
        index=index,
        location=f"line {line}" if line is not None else None,
        status=status,
        elapsed_ms=elapsed,
        timed_out=timed_out,
        truncated=record.get("truncated") is True,
        url=url if isinstance(url, str) else None,
        method=method if isinstance(method, str) else None,
        request_headers=redact_headers(headers) if isinstance(headers, dict) else None,
        response_headers=redact_headers(response_headers)
        if isinstance(response_headers, dict)
        else None,
    )


@_guarded
def parse_pair_document(data: bytes | str, *, file: str = "<pair>") -> Exchange:
    """A single JSON file {"request": ..., "response": ..., optional status/elapsed_ms}."""
    text, raw = _decode(data, file)
    if not text.strip():
        raise CaptureError(file, None, "empty file")
    value = _loads(text, file)
    return _exchange_from_record(
        value, file, sha256=_sha256(raw), index=0, line=None, source_format="pair"
    )


@_guarded
def parse_jsonl(data: bytes | str, *, file: str = "<jsonl>") -> list[Exchange]:
    """One exchange record per line (blank lines skipped)."""
    text, raw = _decode(data, file)
    digest = _sha256(raw)
    exchanges: list[Exchange] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        value = _loads(line, file, line_offset=number - 1, what="JSON line")
        exchanges.append(
            _exchange_from_record(
                value, file, sha256=digest, index=len(exchanges), line=number, source_format="jsonl"
            )
        )
    if not exchanges:
        raise CaptureError(file, None, "no exchanges (the file has no JSON lines)")
    return exchanges


@_guarded
def parse_sse(
    data: bytes | str,
    *,
    file: str = "<sse>",
    request: bytes | str | None = None,
    request_file: str | None = None,
) -> Exchange:
    """A streamed transcript (optionally with its request) reassembled into one response."""
    text, raw = _decode(data, file)
    request_body: dict[str, Any] = {}
    parts = [raw]
    if request is not None:
        request_file = request_file or file
        request_text, request_raw = _decode(request, request_file)
        request_body = _request_body(
            _loads(request_text, request_file, what="JSON request"), request_file, "$"
        )
        parts = [request_raw, raw]
    stripped = text.lstrip()
    status = None
    headers: dict[str, str] = {}
    offset = _lines_before(text, len(text) - len(stripped))
    if _HTTP_STATUS_LINE.match(stripped.split("\n", 1)[0].rstrip("\r")):
        status, headers, stripped, consumed = _split_http_head(stripped, file)
        offset += consumed
    if not _looks_like_sse(stripped):
        raise CaptureError(file, offset + 1, "not an SSE transcript (expected `data:` lines)")
    body = _reassemble_sse(stripped, file, line_offset=offset, status=status)
    body.headers = headers
    return _exchange_from_body(
        request_body, body, source_format="sse", file=file, sha256=_sha256(*parts)
    )


# curl options that take a value (short letters and long names); everything else is a flag.
_CURL_SHORT_WITH_ARG = set("dHXoubcAemwxFTKErUyYzCDPQtv") - {"v"}
_CURL_LONG_WITH_ARG = {
    "data",
    "data-raw",
    "data-binary",
    "data-ascii",
    "data-urlencode",
    "json",
    "header",
    "request",
    "url",
    "output",
    "user",
    "cookie",
    "cookie-jar",
    "user-agent",
    "referer",
    "max-time",
    "connect-timeout",
    "write-out",
    "proxy",
    "form",
    "form-string",
    "upload-file",
    "config",
    "cert",
    "key",
    "cacert",
    "capath",
    "resolve",
    "connect-to",
    "retry",
    "retry-delay",
    "retry-max-time",
    "limit-rate",
    "interface",
    "dump-header",
    "trace",
    "trace-ascii",
    "stderr",
    "oauth2-bearer",
    "aws-sigv4",
    "proxy-user",
    "variable",
    "unix-socket",
    "abstract-unix-socket",
    "max-filesize",
    "keepalive-time",
    "tls-max",
    "ciphers",
    "pass",
    "key-type",
    "cert-type",
    "doh-url",
    "dns-servers",
    "local-port",
    "max-redirs",
    "noproxy",
    "preproxy",
    "proxy-header",
    "range",
    "speed-limit",
    "speed-time",
    "time-cond",
    "url-query",
    "expect100-timeout",
    "happy-eyeballs-timeout-ms",
    "output-dir",
    "proto",
    "proto-redir",
    "request-target",
    "sasl-authzid",
    "service-name",
    "socks5",
    "socks5-hostname",
    "socks4",
    "socks4a",
    "tls13-ciphers",
    "create-file-mode",
    "etag-save",
    "etag-compare",
    "netrc-file",
    "login-options",
    "mail-from",
    "mail-rcpt",
    "hostpubmd5",
    "pinnedpubkey",
    "crlfile",
    "curves",
    "krb",
    "ftp-port",
    "quote",
    "telnet-option",
}
_CURL_SHORT_TO_LONG = {
    "d": "data",
    "H": "header",
    "X": "request",
    "u": "user",
    "b": "cookie",
    "m": "max-time",
    "U": "proxy-user",
    "o": "output",
    "w": "write-out",
}
_CURL_DATA_OPTIONS = {"data", "data-raw", "data-binary", "data-ascii", "data-urlencode", "json"}


def _split_curl_command(text: str, file: str) -> tuple[str, int, str, int]:
    """The command (continuations joined), its first line, the rest (output) and its line."""
    lines = text.split("\n")
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start == len(lines):
        raise CaptureError(file, None, "empty file")
    collected: list[str] = []
    for i in range(start, len(lines)):
        line = lines[i].rstrip("\r")
        if line.rstrip().endswith("\\") and not line.rstrip().endswith("\\\\"):
            collected.append(line.rstrip()[:-1])
            continue
        collected.append(line)
        command = "\n".join(collected)
        try:
            shlex.split(command)
        except ValueError:
            continue  # a quoted argument spans lines (a multi-line -d '{...}')
        return command, start + 1, "\n".join(lines[i + 1 :]), i + 2
    try:
        shlex.split("\n".join(collected))
    except ValueError as exc:
        raise CaptureError(file, start + 1, f"cannot split the curl command: {exc}") from None
    return "\n".join(collected), start + 1, "", len(lines) + 1


@dataclass
class _CurlRequest:
    url: str | None = None
    method: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    data: list[tuple[str, str]] = field(default_factory=list)  # (option, value)
    max_time: float | None = None


def _parse_curl_args(argv: list[str], file: str, line: int) -> _CurlRequest:
    while argv and argv[0] in ("$", "%", ">", "#"):
        argv = argv[1:]
    if argv and argv[0].startswith("$") and argv[0] != "$":
        argv[0] = argv[0].lstrip("$")
    if not argv or not (argv[0] == "curl" or argv[0].endswith("/curl") or argv[0] == "curl.exe"):
        raise CaptureError(file, line, "not a curl command (it must start with `curl`)")
    result = _CurlRequest()
    i = 1
    options_done = False

    def take_value(name: str, inline: str | None) -> str:
        nonlocal i
        if inline is not None:
            return inline
        i += 1
        if i >= len(argv):
            raise CaptureError(file, line, f"curl option --{name} has no value")
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        if options_done or not arg.startswith("-") or arg == "-":
            if result.url is None:
                result.url = arg
            i += 1
            continue
        if arg == "--":
            options_done = True
            i += 1
            continue
        if arg.startswith("--"):
            name, eq, inline = arg[2:].partition("=")
            value = None
            if name in _CURL_LONG_WITH_ARG:
                value = take_value(name, inline if eq else None)
            _apply_curl_option(result, name, value)
            i += 1
            continue
        # Short options may be clustered: -sSX POST, -sXPOST, -d@body.json
        cluster = arg[1:]
        position = 0
        while position < len(cluster):
            letter = cluster[position]
            if letter in _CURL_SHORT_WITH_ARG:
                rest = cluster[position + 1 :]
                value = take_value(letter, rest if rest else None)
                _apply_curl_option(result, _CURL_SHORT_TO_LONG.get(letter, letter), value)
                break
            _apply_curl_option(result, letter, None)
            position += 1
        i += 1
    return result


def _apply_curl_option(request: _CurlRequest, name: str, value: str | None) -> None:
    if value is None:
        return
    if name in _CURL_DATA_OPTIONS:
        request.data.append((name, value))
        if name == "json":
            request.headers.append(("Content-Type", "application/json"))
            request.headers.append(("Accept", "application/json"))
    elif name == "header":
        header_name, colon, header_value = value.partition(":")
        if colon:
            request.headers.append((header_name.strip(), header_value.strip()))
    elif name == "request":
        request.method = value
    elif name == "url":
        request.url = value
    elif name == "user" or name == "proxy-user":
        encoded = base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()
        header = "Authorization" if name == "user" else "Proxy-Authorization"
        request.headers.append((header, f"Basic {encoded}"))
    elif name == "oauth2-bearer":
        request.headers.append(("Authorization", f"Bearer {value}"))
    elif name == "cookie":
        request.headers.append(("Cookie", value))
    elif name == "max-time":
        try:
            request.max_time = float(value)
        except ValueError:
            request.max_time = None


def _curl_body(
    request: _CurlRequest, file: str, line: int, base_dir: Path | None
) -> tuple[str, bytes]:
    """The request body the curl command sends, and the bytes read from any @file."""
    if not request.data:
        raise CaptureError(
            file,
            line,
            "curl command has no request body (-d/--data/--data-raw/--data-binary/--json)",
        )
    pieces: list[str] = []
    extra: list[bytes] = []
    for option, value in request.data:
        if value.startswith("@") and option != "data-raw":
            target = value[1:]
            if target == "-":
                raise CaptureError(
                    file, line, "the body comes from stdin (@-); save it to a file and use @FILE"
                )
            if base_dir is None:
                raise CaptureError(
                    file,
                    line,
                    f"the body is read from a file ({value}); give the capture as a file",
                )
            path = Path(target).expanduser()
            if not path.is_absolute():
                path = base_dir / path
            try:
                size = path.stat().st_size
            except OSError:
                raise CaptureError(file, line, f"body file {target!r} not found") from None
            if size > MAX_CAPTURE_BYTES:
                raise CaptureError(
                    str(path), None, f"body file is {size} bytes, over the 32 MiB limit"
                )
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise CaptureError(
                    file, line, f"cannot read body file {target!r}: {exc.strerror}"
                ) from None
            body_text, _ = _decode(raw, str(path))
            if option in ("data", "data-ascii"):
                body_text = body_text.replace("\r", "").replace("\n", "")  # what curl -d does
            pieces.append(body_text)
            extra.append(raw)
        else:
            pieces.append(value)
    return "&".join(pieces), b"\0".join(extra)


@_guarded
def parse_curl(
    command: bytes | str,
    response: bytes | str | None = None,
    *,
    file: str = "<curl>",
    response_file: str | None = None,
    base_dir: str | Path | None = None,
) -> Exchange:
    """A curl command line plus its response (given, or the output following the command)."""
    text, raw = _decode(command, file)
    command_text, line, trailing, trailing_line = _split_curl_command(text, file)
    try:
        argv = shlex.split(command_text)
    except ValueError as exc:
        raise CaptureError(file, line, f"cannot split the curl command: {exc}") from None
    request = _parse_curl_args(argv, file, line)
    base = Path(base_dir) if base_dir is not None else None
    body_text, body_raw = _curl_body(request, file, line, base)
    if not body_text.strip():
        raise CaptureError(file, line, "curl request body is empty")
    try:
        body_value = json.loads(body_text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise CaptureError(
            file,
            line,
            f"request body (-d) is not JSON: {exc.msg} "
            f"(body line {exc.lineno}, column {exc.colno})",
        ) from None
    except (ValueError, RecursionError):
        raise CaptureError(file, line, "request body (-d) is not valid JSON") from None
    _check_depth(body_value, file)
    request_body = _request_body(body_value, file, f"line {line}, request body")
    parts = [raw]
    if body_raw:
        parts.append(body_raw)
    if response is not None:
        response_file = response_file or file
        response_text, response_raw = _decode(response, response_file)
        parts.append(response_raw)
        body = _parse_body(response_text, response_file)
    elif trailing.strip():
        body = _parse_body(trailing, file, line_offset=trailing_line - 1)
    else:
        raise CaptureError(
            file,
            None,
            "no response: give the response file (--response) "
            "or paste the output after the command",
        )
    method = request.method or "POST"
    return _exchange_from_body(
        request_body,
        body,
        source_format="curl",
        file=file,
        sha256=_sha256(*parts),
        url=request.url,
        method=method,
        request_headers=redact_headers(request.headers),
    )


_CHAT_PATH = re.compile(r"/chat/completions/?$")


def _har_headers(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        return []
    out = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            out.append((item["name"], str(item.get("value", ""))))
    return out


def _har_timings(value: Any) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    timings = {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not str(k).startswith("_")
    }
    return timings or None


@_guarded
def parse_har(data: bytes | str, *, file: str = "<har>") -> list[Exchange]:
    """Every POST .../chat/completions entry of a HAR 1.2 file."""
    text, raw = _decode(data, file)
    if not text.strip():
        raise CaptureError(file, None, "empty file")
    document = _loads(text, file, what="HAR JSON")
    digest = _sha256(raw)
    log = document.get("log") if isinstance(document, dict) else None
    if not isinstance(log, dict):
        raise CaptureError(file, "$.log", "not a HAR file (no `log` object)")
    entries = log.get("entries")
    if not isinstance(entries, list):
        raise CaptureError(file, "$.log.entries", "HAR `log.entries` must be an array")
    exchanges: list[Exchange] = []
    for n, entry in enumerate(entries):
        path = f"$.log.entries[{n}]"
        if not isinstance(entry, dict):
            continue
        request = entry.get("request")
        if not isinstance(request, dict):
            continue
        url = request.get("url")
        method = request.get("method")
        if not isinstance(url, str) or not isinstance(method, str) or method.upper() != "POST":
            continue
        try:
            url_path = urlsplit(url).path
        except ValueError:
            continue
        if not _CHAT_PATH.search(url_path):
            continue
        exchanges.append(
            _har_entry(entry, request, url, method, file, path, digest, len(exchanges))
        )
    if not exchanges:
        raise CaptureError(file, "$.log.entries", "HAR has no POST .../chat/completions entries")
    return exchanges


def _har_entry(
    entry: dict[str, Any],
    request: dict[str, Any],
    url: str,
    method: str,
    file: str,
    path: str,
    digest: str,
    index: int,
) -> Exchange:
    post = request.get("postData")
    if (
        not isinstance(post, dict)
        or not isinstance(post.get("text"), str)
        or not post["text"].strip()
    ):
        raise CaptureError(
            file, f"{path}.request.postData.text", "chat request has no recorded body"
        )
    try:
        body_value = json.loads(post["text"], parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        detail = (
            f": {exc.msg} (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise CaptureError(
            file, f"{path}.request.postData.text", f"request body is not JSON{detail}"
        ) from None
    _check_depth(body_value, file)
    request_body = _request_body(body_value, file, f"{path}.request.postData.text")
    response = entry.get("response")
    if not isinstance(response, dict):
        raise CaptureError(file, f"{path}.response", "entry has no response object")
    status = response.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 999:
        raise CaptureError(file, f"{path}.response.status", "response status must be an integer")
    elapsed = entry.get("time")
    elapsed_ms = (
        float(elapsed)
        if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and elapsed >= 0
        else None
    )
    timings = _har_timings(entry.get("timings"))
    content = response.get("content")
    har_error = response.get("_error") or entry.get("_error")
    body_text = content.get("text") if isinstance(content, dict) else None
    common: dict[str, Any] = dict(
        source_format="har",
        file=file,
        sha256=digest,
        index=index,
        location=path,
        elapsed_ms=elapsed_ms,
        url=url,
        method=method,
        request_headers=redact_headers(_har_headers(request.get("headers"))),
        response_headers=redact_headers(_har_headers(response.get("headers"))),
        http_timings=timings,
    )
    if status == 0:
        # No response: the browser aborted, timed out or lost the connection.
        reason = str(har_error) if har_error else "no response (status 0)"
        timed_out = bool(re.search(r"time(d)?[ _-]?out", reason, re.IGNORECASE))
        body = _Body(error=None if timed_out else _normalise_error(reason, in_stream=False))
        if body_text:
            body = _parse_body(body_text, file, path=f"{path}.response.content.text")
            return _exchange_from_body(
                request_body, body, status=None, timed_out=timed_out, truncated=True, **common
            )
        return _exchange_from_body(request_body, body, status=None, timed_out=timed_out, **common)
    if not isinstance(body_text, str) or not body_text:
        if status >= 400:
            body = _Body(
                error={
                    "message": f"HTTP {status} (body not recorded)",
                    "type": None,
                    "code": status,
                    "in_stream": False,
                }
            )
            return _exchange_from_body(request_body, body, status=status, **common)
        raise CaptureError(
            file,
            f"{path}.response.content.text",
            "response body not recorded: export the HAR with content (browsers often drop "
            "streamed bodies; capture those with curl -N instead)",
        )
    if isinstance(content, dict) and content.get("encoding") == "base64":
        try:
            decoded = base64.b64decode("".join(body_text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise CaptureError(
                file, f"{path}.response.content.text", "response body is not valid base64"
            ) from None
        body_text, _ = _decode(decoded, file)
    body = _parse_body(body_text, file, status=status, path=f"{path}.response.content.text")
    return _exchange_from_body(request_body, body, status=status, **common)


# --------------------------------------------------------------------------------------
# Detection and file entry points
# --------------------------------------------------------------------------------------


def _looks_like_curl(text: str) -> bool:
    first = text.lstrip().split(None, 2)
    if not first:
        return False
    head = first[0]
    if head in ("$", "%", ">") and len(first) > 1:
        head = first[1]
    head = head.lstrip("$")
    return head == "curl" or head.endswith("/curl") or head == "curl.exe"


@_guarded
def detect_format(data: bytes | str, file: str = "") -> str:
    """Best guess of a capture's format: pair|curl|sse|har|jsonl, or request|response.

    `request` and `response` are bare bodies that need their other half (see `load_file`).
    """
    suffix = Path(file).suffix.lower() if file else ""
    if suffix == ".har":
        return "har"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if isinstance(data, (bytes, bytearray)):
        text = bytes(data[:MAX_CAPTURE_BYTES]).decode("utf-8", "replace")
    else:
        text = data
    text = text.lstrip("\ufeff")
    stripped = text.strip()
    if not stripped:
        return "pair"
    if _looks_like_curl(stripped):
        return "curl"
    if _looks_like_sse(stripped):
        return "sse"
    if _HTTP_STATUS_LINE.match(stripped.split("\n", 1)[0].rstrip("\r")):
        return "sse" if "\ndata:" in stripped else "response"
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            if isinstance(value.get("log"), dict) and "entries" in value["log"]:
                return "har"
            if "request" in value and "response" in value:
                return "pair"
            if "choices" in value or "error" in value:
                return "response"
            if "messages" in value or "model" in value:
                return "request"
            return "pair"
        if value is None and stripped.count("\n") >= 1:
            return "jsonl"
    return "pair"


def read_file(path: str | Path) -> bytes:
    """A capture file's bytes, refusing directories and files over MAX_CAPTURE_BYTES."""
    p = Path(path)
    name = str(path)
    try:
        size = p.stat().st_size
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CaptureError(name, None, f"cannot open: {reason}") from None
    if p.is_dir():
        raise CaptureError(name, None, "is a directory")
    if size > MAX_CAPTURE_BYTES:
        raise CaptureError(
            name, None, f"file is {size} bytes, over the {MAX_CAPTURE_BYTES} byte limit (32 MiB)"
        )
    try:
        with p.open("rb") as handle:
            data = handle.read(MAX_CAPTURE_BYTES + 1)
    except OSError as exc:
        raise CaptureError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_CAPTURE_BYTES:
        raise CaptureError(name, None, f"file is over the {MAX_CAPTURE_BYTES} byte limit (32 MiB)")
    return data


@_guarded
def parse(
    data: bytes | str,
    *,
    format: str = "auto",
    file: str = "<input>",
    response: bytes | str | None = None,
    response_file: str | None = None,
    request: bytes | str | None = None,
    request_file: str | None = None,
    base_dir: str | Path | None = None,
) -> list[Exchange]:
    """Parse one capture in the given (or detected) format into exchanges."""
    if format not in ("auto", *FORMATS):
        raise CaptureError(
            file, None, f"unknown format {format!r} (expected auto or one of {', '.join(FORMATS)})"
        )
    kind = detect_format(data, file) if format == "auto" else format
    if kind == "curl":
        return [
            parse_curl(data, response, file=file, response_file=response_file, base_dir=base_dir)
        ]
    if kind == "sse":
        return [parse_sse(data, file=file, request=request, request_file=request_file)]
    if kind == "har":
        return parse_har(data, file=file)
    if kind == "jsonl":
        return parse_jsonl(data, file=file)
    if kind == "request":
        if response is None:
            raise CaptureError(
                file, None, "this is a request body; give its response too (--response FILE)"
            )
        return [parse_pair(data, response, file=response_file or file, request_file=file)]
    if kind == "response":
        return [parse_pair(request, data, file=file, request_file=request_file)]
    # pair: a {"request":..,"response":..} document, or a request with --response
    if response is not None:
        return [parse_pair(data, response, file=response_file or file, request_file=file)]
    if request is not None:
        return [parse_pair(request, data, file=file, request_file=request_file)]
    return [parse_pair_document(data, file=file)]


@_guarded
def load_file(
    path: str | Path,
    *,
    format: str = "auto",
    response: str | Path | None = None,
    request: str | Path | None = None,
) -> list[Exchange]:
    """Read a capture file (and its companion response/request file) into exchanges."""
    name = str(path)
    data = read_file(path)
    response_data = read_file(response) if response is not None else None
    request_data = read_file(request) if request is not None else None
    return parse(
        data,
        format=format,
        file=name,
        response=response_data,
        response_file=str(response) if response is not None else None,
        request=request_data,
        request_file=str(request) if request is not None else None,
        base_dir=Path(path).parent,
    )


@_guarded
def exchange_from_http(
    request: Mapping[str, Any],
    body: bytes | str | Mapping[str, Any] | None,
    *,
    status: int | None = None,
    elapsed_ms: float | None = None,
    timed_out: bool = False,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    response_headers: Mapping[str, str] | None = None,
    source_file: str = "live",
    index: int = 0,
) -> Exchange:
    """An exchange from a live HTTP call (probe replies): body as received, JSON or SSE."""
    record: dict[str, Any] = {
        "request": dict(request),
        "response": dict(body) if isinstance(body, Mapping) else body,
        "status": status,
        "elapsed_ms": elapsed_ms,
        "timed_out": timed_out,
        "url": url,
        "method": "POST",
    }
    if headers is not None:
        record["request_headers"] = dict(headers)
    if response_headers is not None:
        record["response_headers"] = dict(response_headers)
    if isinstance(body, (bytes, bytearray)):
        text, _ = _decode(bytes(body), source_file)
        record["response"] = text
    raw = json.dumps(record, sort_keys=True, default=str).encode()
    return _exchange_from_record(
        record, source_file, sha256=_sha256(raw), index=index, line=None, source_format="live"
    )
