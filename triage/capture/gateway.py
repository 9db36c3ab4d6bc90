"""Gateway-style exchange records: `{"request": {"headers", "body", "url", "method"},
"response": {"status", "headers", "body"}}` (API gateways, LLM proxies, request loggers),
flattened into the record shape every other reader uses:
`{"request": BODY, "response": BODY, "status", "request_headers", "response_headers",
"url", "method"}`. Fields already given at the top level win."""

from __future__ import annotations

import json
from typing import Any

from kb.jsontypes import JsonObject
from triage.capture.common import check_depth, reject_constant
from triage.capture.model import CaptureError

__all__ = ["flatten_gateway_record", "is_gateway_envelope"]

_REQUEST_FIELDS = ("headers", "url", "method", "path")
_RESPONSE_FIELDS = ("status", "status_code", "headers", "statusCode")


def is_gateway_envelope(value: Any, *, response: bool) -> bool:
    """An HTTP envelope (body plus transport fields) rather than a chat body itself."""
    if not isinstance(value, dict) or "body" not in value:
        return False
    if response:
        return "choices" not in value and any(k in value for k in _RESPONSE_FIELDS)
    return (
        "messages" not in value
        and "prompt" not in value
        and (any(k in value for k in _REQUEST_FIELDS) or len(value) == 1)
    )


def _headers(value: Any) -> dict[str, str] | None:
    """Headers as a dict: a mapping, or a list of {name, value} / [name, value] pairs."""
    if isinstance(value, dict):
        return {
            str(k): ", ".join(map(str, v)) if isinstance(v, list) else str(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out[item["name"]] = str(item.get("value", ""))
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                out[str(item[0])] = str(item[1])
        return out
    return None


def _request_json(body: Any, file: str, where: str) -> Any:
    """A request body given as JSON text inside the envelope."""
    if not isinstance(body, str):
        return body
    try:
        value = json.loads(body, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise CaptureError(file, where, "request body is not JSON") from None
    check_depth(value, file)
    return value


def flatten_gateway_record(record: JsonObject, file: str, where: Any) -> JsonObject:
    """The record with gateway envelopes unwrapped (unchanged when there are none)."""
    request, response = record.get("request"), record.get("response")
    request_envelope = is_gateway_envelope(request, response=False)
    response_envelope = is_gateway_envelope(response, response=True)
    if not (request_envelope or response_envelope):
        return record
    flat = dict(record)
    if request_envelope:
        assert isinstance(request, dict)
        flat["request"] = _request_json(request["body"], file, where("$.request.body"))
        for target, source in (
            ("request_headers", "headers"),
            ("url", "url"),
            ("method", "method"),
        ):
            if target not in record and request.get(source) is not None:
                flat[target] = request[source]
        if "request_headers" in flat:
            flat["request_headers"] = _headers(flat["request_headers"])
    if response_envelope:
        assert isinstance(response, dict)
        flat["response"] = response["body"]
        status = next(
            (response[k] for k in ("status", "status_code", "statusCode") if k in response), None
        )
        if "status" not in record and "status_code" not in record and status is not None:
            flat["status"] = status
        if "response_headers" not in record and response.get("headers") is not None:
            flat["response_headers"] = _headers(response["headers"])
    return flat
