"""The `har` format: every POST .../chat/completions entry of a HAR 1.2 file (browser
devtools, mitmproxy, Charles)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kb.jsontypes import JsonObject
from triage.capture.body import parse_body
from triage.capture.common import (
    Body,
    check_depth,
    exchange_from_body,
    guarded,
    http_error,
    loads,
    normalise_error,
    reject_constant,
    request_body,
    sha256_of,
)
from triage.capture.formats import CaptureFormat, json_document
from triage.capture.model import CaptureError, Exchange, PartialCapture
from triage.capture.reading import decode
from triage.capture.redact import redact_headers

__all__ = ["FORMAT", "parse_har", "register"]

# Chat completions, and llama-server's embeddings and rerank routes (/v1/embeddings,
# /embeddings, /v1/rerank, /rerank, /v1/reranking; not the non-OpenAI /embedding).
_CHAT_PATH = re.compile(r"/(?:chat/completions|embeddings|rerank(?:ing)?)/?$")


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


@guarded
def parse_har(data: bytes | str, *, file: str = "<har>") -> list[Exchange]:
    """Every POST .../chat/completions (or embeddings / rerank) entry of a HAR 1.2 file."""
    text, raw = decode(data, file)
    if not text.strip():
        raise CaptureError(file, None, "empty file")
    document = loads(text, file, what="HAR JSON")
    digest = sha256_of(raw)
    log = document.get("log") if isinstance(document, dict) else None
    if not isinstance(log, dict):
        raise CaptureError(file, "$.log", "not a HAR file (no `log` object)")
    entries = log.get("entries")
    if not isinstance(entries, list):
        raise CaptureError(file, "$.log.entries", "HAR `log.entries` must be an array")
    exchanges: list[Exchange] = []
    errors: list[CaptureError] = []
    total = 0
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
        total += 1
        try:
            exchange = _har_entry(entry, request, url, method, file, path, digest, len(exchanges))
        except CaptureError as exc:
            errors.append(exc)
            continue
        exchanges.append(exchange)
    if errors:
        raise PartialCapture(file, errors, exchanges, total)
    if not exchanges:
        raise CaptureError(
            file,
            "$.log.entries",
            "HAR has no POST .../chat/completions entries (nor .../embeddings, .../rerank)",
        )
    return exchanges


def _har_request_body(request: JsonObject, file: str, path: str) -> JsonObject:
    where = f"{path}.request.postData.text"
    post = request.get("postData")
    text = post.get("text") if isinstance(post, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise CaptureError(file, where, "chat request has no recorded body")
    try:
        body_value = json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        detail = (
            f": {exc.msg} (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise CaptureError(file, where, f"request body is not JSON{detail}") from None
    check_depth(body_value, file)
    return request_body(body_value, file, where)


def _aborted(body_text: Any, har_error: Any, file: str, path: str) -> tuple[Body, bool, bool]:
    """Status 0: the browser aborted, timed out or lost the connection.
    Returns the body, timed_out, truncated."""
    reason = str(har_error) if har_error else "no response (status 0)"
    timed_out = bool(re.search(r"time(d)?[ _-]?out", reason, re.IGNORECASE))
    if body_text:
        return parse_body(body_text, file, path=f"{path}.response.content.text"), timed_out, True
    error = None if timed_out else normalise_error(reason, in_stream=False)
    return Body(error=error), timed_out, False


def _recorded_body(content: Any, status: int, file: str, path: str) -> Body:
    where = f"{path}.response.content.text"
    body_text = content.get("text") if isinstance(content, dict) else None
    if not isinstance(body_text, str) or not body_text:
        if status >= 400:
            return Body(error=http_error(status, f"HTTP {status} (body not recorded)"))
        raise CaptureError(
            file,
            where,
            "response body not recorded: export the HAR with content (browsers often drop "
            "streamed bodies; capture those with curl -N instead)",
        )
    if isinstance(content, dict) and content.get("encoding") == "base64":
        try:
            decoded = base64.b64decode("".join(body_text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise CaptureError(file, where, "response body is not valid base64") from None
        body_text, _ = decode(decoded, file)
    return parse_body(body_text, file, status=status, path=where)


def _har_entry(
    entry: JsonObject,
    request: JsonObject,
    url: str,
    method: str,
    file: str,
    path: str,
    digest: str,
    index: int,
) -> Exchange:
    request_value = _har_request_body(request, file, path)
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
    content = response.get("content")
    timed_out = truncated = False
    if status == 0:
        body_text = content.get("text") if isinstance(content, dict) else None
        har_error = response.get("_error") or entry.get("_error")
        body, timed_out, truncated = _aborted(body_text, har_error, file, path)
    else:
        body = _recorded_body(content, status, file, path)
    return exchange_from_body(
        request_value,
        body,
        status=status or None,
        timed_out=timed_out,
        truncated=truncated,
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
        http_timings=_har_timings(entry.get("timings")),
    )


def _sniff(text: str) -> bool:
    value = json_document(text)
    return (
        isinstance(value, dict)
        and isinstance(value.get("log"), dict)
        and ("entries" in value["log"])
    )


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    return parse_har(text, file=file)


FORMAT = CaptureFormat(
    id="har",
    label="HAR 1.2 file (browser devtools, mitmproxy): every POST .../chat/completions, "
    ".../embeddings, .../rerank",
    suffixes=(".har",),
    priority=30,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the HAR format to the catalogue."""
    catalogue.formats.add(FORMAT)
