"""Built-in checks on the transport: parse-failure, truncated-stream, http-error, timeout."""

from __future__ import annotations

import json
import re

from triage.catalogue import Catalogue
from triage.checks.base import (
    TIMEOUT_STATUSES,
    Finding,
    View,
    _pass,
    check,
)

# --------------------------------------------------------------------------------------
# Transport
# --------------------------------------------------------------------------------------

_PARSE_FAILURE = re.compile(
    r"does not match the expected (?P<format>[\w.\- ]{1,60}?) format"  # llama.cpp PEG parsers
    r"|Failed to parse tool call arguments as JSON"
    r"|Failed to parse input at pos \d+"  # older chat parsers
    r"|Invalid diff: "
)


def _error_message(view: View) -> str:
    if view.error is not None:
        message = view.error.get("message")
        if isinstance(message, str):
            return message
        return json.dumps(view.error, default=str)[:2000]
    return ""


@check("parse-failure", number=7)
def check_parse_failure(view: View) -> list[Finding]:
    """llama-server could not parse the model's output into a message (HTTP 500 / stream error)."""
    kind = "parse-failure"
    for text, where in (
        (_error_message(view), "$.error.message"),
        (view.response_text or "", "$.response_text"),
    ):
        if not text:
            continue
        match = _PARSE_FAILURE.search(text)
        if match:
            fmt = match.group("format")
            label = f"the {fmt} parser" if fmt else "the chat parser"
            status = f"HTTP {view.status}: " if view.status else ""
            in_stream = view.error is not None and view.error.get("in_stream") is True
            return [
                Finding(
                    kind,
                    False,
                    1.0,
                    f"{status}{label} rejected the model output"
                    f"{' mid-stream' if in_stream else ''}: {text[:200]}",
                    where,
                    match.start(),
                )
            ]
    return _pass(kind, "no parser error")


@check("truncated-stream", number=8)
def check_truncated(view: View) -> list[Finding]:
    """The stream ended without [DONE] and without a finish_reason."""
    if view.truncated:
        return [
            Finding(
                "truncated-stream",
                False,
                1.0,
                "the stream ended without [DONE] or a finish_reason (connection cut?)",
                "$.truncated",
            )
        ]
    return _pass("truncated-stream", "stream complete (or not streamed)")


@check("http-error", number=9)
def check_http_error(view: View) -> list[Finding]:
    """The server answered with an error status or an error object (also mid-stream)."""
    kind = "http-error"
    message = _error_message(view)[:300]
    if view.status is not None and view.status >= 400:
        return [
            Finding(
                kind,
                False,
                1.0,
                f"HTTP {view.status}" + (f": {message}" if message else ""),
                "$.status",
            )
        ]
    if view.error is not None:
        in_stream = view.error.get("in_stream") is True
        prefix = "error event mid-stream" if in_stream else "error response"
        return [Finding(kind, False, 1.0, f"{prefix}: {message}", "$.error")]
    if view.response is None and not view.timed_out and view.response_text is None:
        return [Finding(kind, False, 1.0, "no response body", "$.response")]
    return _pass(kind, f"HTTP {view.status}" if view.status else "no error")


@check("timeout", number=10)
def check_timeout(view: View) -> list[Finding]:
    """The request timed out (client-side, or a 408/504 from a proxy)."""
    if view.timed_out:
        return [Finding("timeout", False, 1.0, "the request timed out", "$.timed_out")]
    if view.status in TIMEOUT_STATUSES:
        return [Finding("timeout", False, 1.0, f"HTTP {view.status} (timeout)", "$.status")]
    return _pass("timeout", "no timeout")


CHECKS = (check_parse_failure, check_truncated, check_http_error, check_timeout)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
