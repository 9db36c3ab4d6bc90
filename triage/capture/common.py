"""Helpers every format shares: the only-CaptureError guard, JSON loading with positions,
error normalisation, hashing and the final build-and-validate step of an exchange."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kb.jsontypes import JsonObject
from triage.capture.model import (
    MAX_JSON_DEPTH,
    CaptureError,
    Exchange,
    reject_constant,
    validate_exchange,
)
from triage.capture.redact import redact_json, redact_text, redact_url

__all__ = [
    "Body",
    "check_depth",
    "exchange_from_body",
    "finish",
    "guarded",
    "json_type",
    "lines_before",
    "loads",
    "normalise_error",
    "reject_constant",
    "request_body",
    "sha256_of",
    "status_from_error",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(func: _F) -> _F:
    """Parsers raise CaptureError and nothing else, whatever the input."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CaptureError:
            raise
        except RecursionError:
            raise CaptureError(_file_arg(kwargs), None, "input nests too deeply") from None
        except Exception as exc:  # noqa: BLE001 -- the contract: only CaptureError escapes
            # The exception text may quote the input; name only its type.
            raise CaptureError(
                _file_arg(kwargs), None, f"cannot read capture ({type(exc).__name__})"
            ) from None

    return wrapper  # type: ignore[return-value]


def _file_arg(kwargs: dict[str, Any]) -> str:
    file = kwargs.get("file")
    return str(file) if file else "<input>"


def sha256_of(*parts: bytes) -> str:
    """SHA-256 of the input bytes; several inputs are joined by a NUL byte."""
    digest = hashlib.sha256()
    for i, part in enumerate(parts):
        if i:
            digest.update(b"\0")
        digest.update(part)
    return digest.hexdigest()


def loads(text: str, file: str, line_offset: int = 0, what: str = "JSON") -> Any:
    """json.loads with errors that name the line and column."""
    try:
        value = json.loads(text, parse_constant=reject_constant)
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
    check_depth(value, file)
    if _SURROGATE_ESCAPE.search(text):
        check_unicode(value, file, line_offset + 1 if line_offset else None)
    return value


# `\ud800`..`\udfff` in JSON text: a pair becomes one character, a lone one stays a
# surrogate that no UTF-8 writer (hashing, the database) accepts.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_unicode(value: Any, file: str, line: int | None = None) -> None:
    """Refuse a string (or key) holding a lone surrogate, naming its JSON path (after the
    line of a JSONL record)."""
    stack: list[tuple[Any, str]] = [(value, f"line {line}, $" if line else "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                raise CaptureError(
                    file,
                    path,
                    f"not valid Unicode: a lone surrogate \\u{ord(found.group()):04x} at "
                    f"character {found.start() + 1}",
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    raise CaptureError(
                        file, path, "not valid Unicode: a key holds a lone surrogate"
                    )
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{n}]") for n, child in enumerate(item))


def check_depth(value: Any, file: str) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise CaptureError(file, None, f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def lines_before(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


def json_type(value: Any) -> str:
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


def normalise_error(raw: Any, *, in_stream: bool) -> JsonObject:
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


def status_from_error(error: JsonObject) -> int | None:
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


def http_error(status: int, message: str) -> JsonObject:
    """The error of an HTTP failure whose body says nothing more."""
    return {"message": message, "type": None, "code": status, "in_stream": False}


@dataclass
class Body:
    """What a response body turned into."""

    response: dict[str, Any] | None = None
    response_text: str | None = None
    error: dict[str, Any] | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    timed_out: bool = False
    stream: bool = False


def request_body(value: Any, file: str, location: str | int | None) -> JsonObject:
    """A request body (must be a JSON object), redacted."""
    if not isinstance(value, dict):
        raise CaptureError(file, location, f"request must be a JSON object, got {json_type(value)}")
    redacted: dict[str, Any] = redact_json(value)
    return redacted


def finish(exchange: Exchange, file: str) -> Exchange:
    """Validate against the schema; a violation here is reported like any bad input."""
    errors = validate_exchange(exchange.to_dict())
    if errors:
        json_path, message = errors[0]
        where = f"{exchange.location}, {json_path}" if exchange.location else json_path
        raise CaptureError(file, where, f"not a valid exchange: {message}")
    return exchange


def display_name(file: str) -> str:
    return Path(file).name or file


def exchange_from_body(
    request: JsonObject,
    body: Body,
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
    """The validated exchange of a request and a parsed response body."""
    final_status = status if status is not None else body.status
    if final_status is None and body.error is not None and not body.error.get("in_stream"):
        # A streamed error arrives after a 200 status line; only a plain error body tells
        # the HTTP status through its code.
        final_status = status_from_error(body.error)
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
        source_file=display_name(file),
        sha256=sha256,
        index=index,
        location=location,
    )
    return finish(exchange, file)
