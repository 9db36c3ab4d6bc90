"""Response bodies in any form (JSON, SSE, `curl -i` head + body, plain text) and the
`{"request":..., "response":...}` record shared by pair documents, JSONL and live calls."""

from __future__ import annotations

import json
import re
from typing import Any

from kb.jsontypes import JsonObject
from triage.capture.common import (
    Body,
    check_depth,
    exchange_from_body,
    http_error,
    json_type,
    lines_before,
    loads,
    normalise_error,
    reject_constant,
    request_body,
    status_from_error,
)
from triage.capture.gateway import flatten_gateway_record
from triage.capture.model import MAX_RESPONSE_TEXT_CHARS, CaptureError, Exchange
from triage.capture.redact import redact_headers, redact_json, redact_text
from triage.capture.stream import looks_like_sse, reassemble_sse

__all__ = [
    "HTTP_STATUS_LINE",
    "exchange_from_record",
    "is_tei_rerank_answer",
    "json_body",
    "parse_body",
    "split_http_head",
]

HTTP_STATUS_LINE = re.compile(r"^HTTP/\d(?:\.\d)?\s+(\d{3})(?:\s.*)?$")
_CURL_TIMEOUT = re.compile(r"curl: \(28\)|operation timed out|timed out after", re.IGNORECASE)
_TIMEOUT_WORDS = re.compile(r"time(d)?[ _-]?out", re.IGNORECASE)


def starts_with_status_line(text: str) -> bool:
    return bool(HTTP_STATUS_LINE.match(text.lstrip().split("\n", 1)[0].rstrip("\r")))


def split_http_head(text: str, file: str) -> tuple[int | None, dict[str, str], str, int]:
    """`curl -i` output: status line and headers, then the body (skips 1xx blocks)."""
    status: int | None = None
    headers: list[tuple[str, str]] = []
    consumed_lines = 0
    rest = text
    while True:
        match = HTTP_STATUS_LINE.match(rest.split("\n", 1)[0].rstrip("\r"))
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


def _body_after_head(
    text: str, file: str, *, status: int | None, line_offset: int, path: str | None
) -> Body:
    stripped = text.lstrip()
    skipped = lines_before(text, len(text) - len(stripped))
    head_status, headers, rest, consumed = split_http_head(stripped, file)
    if rest.strip():
        body = parse_body(
            rest,
            file,
            status=head_status or status,
            line_offset=line_offset + skipped + consumed,
            path=path,
        )
    elif head_status is not None and head_status >= 400:
        body = Body(error=http_error(head_status, f"HTTP {head_status} with an empty body"))
    else:
        raise CaptureError(file, path or line_offset + 1, "response has HTTP headers but no body")
    body.headers = {**headers, **body.headers}
    if body.status is None:
        body.status = head_status
    return body


def parse_body(
    text: str,
    file: str,
    *,
    status: int | None = None,
    line_offset: int = 0,
    path: str | None = None,
) -> Body:
    """A response body in any form: JSON, SSE, `curl -i` head + body, or plain text.

    `line_offset` counts the lines before the body in its file; `path` (a JSON path, used
    when the body is a string inside a JSON document) names where errors point instead.
    """
    if starts_with_status_line(text):
        return _body_after_head(text, file, status=status, line_offset=line_offset, path=path)
    if not text.strip():
        raise CaptureError(
            file, path or (line_offset + 1 if line_offset else None), "empty response"
        )
    if looks_like_sse(text):
        return reassemble_sse(text, file, line_offset=line_offset, status=status)
    stripped = text.strip()
    if stripped[0] in "{[":
        try:
            value = json.loads(stripped, parse_constant=reject_constant)
        except (ValueError, RecursionError):
            value = None
            if status is None or status < 400:
                if path is not None:
                    raise CaptureError(file, path, "response is not valid JSON") from None
                loads(text, file, line_offset, "JSON response")  # raises with the position
        if value is not None:
            check_depth(value, file)
            prefix = path or ("$" if line_offset == 0 else f"line {line_offset + 1}, $")
            return json_body(value, file, status=status, path=prefix)
    return _text_body(stripped, file, status=status, location=path or line_offset + 1)


def _text_body(stripped: str, file: str, *, status: int | None, location: int | str) -> Body:
    # Plain text: an error page, a curl failure message, a crashed server's "Unknown Exception".
    excerpt = redact_text(stripped[:MAX_RESPONSE_TEXT_CHARS])
    if _CURL_TIMEOUT.search(stripped[:2000]):
        return Body(response_text=excerpt, timed_out=True, status=status)
    if status is not None and status >= 400:
        error = http_error(status, excerpt[:2000])
        return Body(response_text=excerpt, error=error, status=status)
    raise CaptureError(
        file, location, "response is neither JSON nor an SSE stream (and no HTTP error status)"
    )


def is_tei_rerank_answer(value: Any) -> bool:
    """A TEI-form `/rerank` answer: a bare list of `{index, score}` objects (b11434 answers a
    request with `texts` so)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and "index" in item and "score" in item for item in value)
    )


def json_body(value: Any, file: str, *, status: int | None, path: str) -> Body:
    """A JSON response body; `path` is where it sits (`$`, `line 3, $.response`). A TEI-form
    rerank answer (a bare list) is held as `{"results": [...]}`, its items as sent."""
    if is_tei_rerank_answer(value) and (status is None or status < 400):
        value = {"results": value}
    if not isinstance(value, dict):
        if status is not None and status >= 400:
            return Body(
                response=None,
                response_text=redact_text(json.dumps(value)[:MAX_RESPONSE_TEXT_CHARS]),
                error=normalise_error(value, in_stream=False),
                status=status,
            )
        raise CaptureError(file, path, f"response must be a JSON object, got {json_type(value)}")
    response = redact_json(value)
    if value.get("error") is not None or (status is not None and status >= 400):
        raw_error = value.get("error", value.get("detail", value))
        error = normalise_error(raw_error, in_stream=False)
        return Body(response=response, error=error, status=status or status_from_error(error))
    if "choices" not in value and isinstance(value.get("data"), list):
        _check_embeddings(value["data"], file, path)
        return Body(response=response, status=status)
    if "choices" not in value and isinstance(value.get("results"), list):
        _check_rerank(value["results"], file, path)
        return Body(response=response, status=status)
    choices = value.get("choices")
    if choices is None:
        raise CaptureError(
            file,
            path,
            "response has no `choices` (chat), `data` (embeddings) or `results` (rerank) "
            "and is not an HTTP error body",
        )
    _check_choices(choices, file, path)
    return Body(response=response, status=status)


def _check_embeddings(data: list[Any], file: str, path: str) -> None:
    """An `/v1/embeddings` list: objects whose `embedding` (when present) is an array --
    a missing or wrong vector is evidence for the embedding-batch check, not bad input."""
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise CaptureError(file, f"{path}.data[{i}]", "an embeddings item must be an object")
        vector = item.get("embedding")
        if vector is not None and not isinstance(vector, (list, str)):  # str: base64
            raise CaptureError(
                file,
                f"{path}.data[{i}].embedding",
                f"`embedding` must be an array, got {json_type(vector)}",
            )


def _check_rerank(results: list[Any], file: str, path: str) -> None:
    """A `/v1/rerank` list: objects with an `index` and a `relevance_score`."""
    for i, item in enumerate(results):
        if not isinstance(item, dict):
            raise CaptureError(file, f"{path}.results[{i}]", "a rerank result must be an object")


def _check_choices(choices: Any, file: str, path: str) -> None:
    def where(suffix: str) -> str:
        return f"{path}.choices{suffix}"

    if not isinstance(choices, list):
        raise CaptureError(file, where(""), f"`choices` must be an array, got {json_type(choices)}")
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


def _transport_number(value: Any, file: str, location: str, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CaptureError(file, location, f"`{name}` must be a non-negative number")
    return float(value)


def _record_status(record: JsonObject, file: str, where: str) -> int | None:
    status = record.get("status", record.get("status_code"))
    if status is not None and (
        isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 999
    ):
        raise CaptureError(file, where, "`status` must be an HTTP status code")
    return None if status == 0 else status


def _record_body(
    raw_response: Any, raw_error: Any, *, status: int | None, timed_out: bool, file: str, where: str
) -> Body:
    if raw_response is None or raw_response == "":
        if not timed_out and raw_error is None and status is None:
            raise CaptureError(
                file, where, "no response, and no status, error or timeout to explain it"
            )
        # A timeout explains the missing body; its error text is not a server error.
        explained = raw_error is not None and not timed_out
        body = Body(error=normalise_error(raw_error, in_stream=False) if explained else None)
        if status is not None and status >= 400 and body.error is None:
            body.error = http_error(status, f"HTTP {status}")
    elif isinstance(raw_response, str):
        body = parse_body(raw_response, file, status=status, path=where)
    else:
        check_depth(raw_response, file)
        body = json_body(raw_response, file, status=status, path=where)
    if body.error is None and raw_error is not None and not timed_out:
        body.error = normalise_error(raw_error, in_stream=False)
    return body


def exchange_from_record(
    record: Any, file: str, *, sha256: str, index: int, line: int | None, source_format: str
) -> Exchange:
    """One {"request":..., "response":..., status, elapsed_ms, ...} record."""

    def where(json_path: str) -> str:
        return json_path if line is None else f"line {line}, {json_path}"

    if not isinstance(record, dict):
        raise CaptureError(
            file, line, f"an exchange record must be a JSON object, got {json_type(record)}"
        )
    record = flatten_gateway_record(record, file, where)
    if "request" not in record:
        raise CaptureError(file, where("$.request"), "record has no `request`")
    if "response" not in record:
        raise CaptureError(file, where("$.response"), "record has no `response`")
    request = request_body(record["request"], file, where("$.request"))
    status = _record_status(record, file, where("$.status"))
    elapsed = _transport_number(record.get("elapsed_ms"), file, where("$.elapsed_ms"), "elapsed_ms")
    timed_out = record.get("timed_out") is True
    raw_error = record.get("error")
    if isinstance(raw_error, str) and _TIMEOUT_WORDS.search(raw_error):
        timed_out = True
    body = _record_body(
        record["response"],
        raw_error,
        status=status,
        timed_out=timed_out,
        file=file,
        where=where("$.response"),
    )
    headers = record.get("request_headers", record.get("headers"))
    response_headers = record.get("response_headers")
    url = record.get("url")
    method = record.get("method")
    return exchange_from_body(
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
