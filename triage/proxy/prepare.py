"""One recorded exchange made ready for the knowledge base: redacted, classified, compressed.

`prepare(record)` builds the exchange the same way captures are built
(`triage.capture.exchange_from_http`: request and response redacted), classifies it with the
same symptom checks (`triage.symptoms.classify`), derives its failure signature and request
shape, and compresses the body (successes only when sampled; failures always). The result,
`Prepared`, is what the writer stores or spools (`to_line` / `from_line`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import cast

from kb.jsontypes import JsonObject
from kb.repo import live
from kb.service.live import LiveExample, LiveRow
from triage.capture import CaptureError, exchange_from_http, redact_headers, redact_text
from triage.proxy.grouping import client_limit, request_shape
from triage.proxy.rates import failure_signature
from triage.proxy.record import ExchangeRecord
from triage.symptoms import USER_FACING_KINDS, classify


@dataclass
class Prepared:
    """One classified, redacted exchange ready for the store (or the spool)."""

    row: LiveRow
    kinds: list[str]
    example: LiveExample | None  # evidence item for a failing exchange
    usage: dict[str, int] = field(default_factory=dict)

    def to_line(self) -> str:
        """The spool's line: JSON, the body base64, the time ISO 8601."""
        row: JsonObject = dict(self.row)
        row["recorded_at"] = self.row["recorded_at"].isoformat()
        body = self.row["body"]
        if body is not None:
            row["body"] = base64.b64encode(body).decode()
        example = None
        if self.example is not None:
            example = {k: v for k, v in self.example.items() if k != "recorded_at"}
        return json.dumps({"row": row, "kinds": self.kinds, "example": example}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Prepared:
        """A spool line back (ValueError, KeyError or TypeError: not one `to_line` wrote)."""
        data = json.loads(line)
        fields = dict(data["row"])
        fields["recorded_at"] = datetime.fromisoformat(fields["recorded_at"])
        if fields.get("body") is not None:
            fields["body"] = base64.b64decode(fields["body"])
        row = cast(LiveRow, fields)  # the spool holds only rows `to_line` wrote
        example = data.get("example")
        if example is not None:
            example["recorded_at"] = row["recorded_at"]
        return cls(row=row, kinds=list(data.get("kinds") or []), example=example)


def _usage(response: JsonObject | None) -> dict[str, int]:
    """Token counts and draft acceptance from a reply's usage/timings (llama-server)."""
    if not isinstance(response, dict):
        return {}
    out: dict[str, int] = {}
    usage = response.get("usage")
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int):
                out[key] = usage[key]
    timings = response.get("timings")
    if isinstance(timings, dict):
        for key in ("draft_n", "draft_n_accepted"):
            if isinstance(timings.get(key), int):
                out[key] = timings[key]
        if "completion_tokens" not in out and isinstance(timings.get("predicted_n"), int):
            out["completion_tokens"] = timings["predicted_n"]
        if "prompt_tokens" not in out and isinstance(timings.get("prompt_n"), int):
            out["prompt_tokens"] = timings["prompt_n"]
    return out


def _sse_timings(text: str) -> dict[str, int]:
    """The last `timings`/`usage` of a stream (the reassembled reply may not keep them)."""
    found: dict[str, int] = {}
    for line in reversed(text.splitlines()):
        if not line.startswith("data:") or "timings" not in line and "usage" not in line:
            continue
        try:
            value = json.loads(line[5:].strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            found = _usage(value)
            if found:
                return found
    return found


@dataclass
class _Classified:
    exchange: JsonObject  # the redacted exchange as a capture file holds it
    findings: list[JsonObject]  # Finding.to_dict(), as stored in the evidence payload
    kinds: list[str]
    usage: dict[str, int]


def _classify(record: ExchangeRecord, body: bytes, transport: bool) -> _Classified:
    """The redacted exchange of a record and its failing user-facing kinds."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in record["request_headers"]}
    response_headers = {
        k.decode("latin-1"): v.decode("latin-1") for k, v in record["response_headers"]
    }
    try:
        request = json.loads(record["request_body"] or b"null")
        exchange = exchange_from_http(
            request if isinstance(request, dict) else {"_raw": request},
            None if transport else body,
            status=None if transport else record.get("status"),
            elapsed_ms=record.get("elapsed_ms"),
            timed_out=bool(record.get("timed_out")),
            url=record["path"],
            headers=headers,
            response_headers=response_headers,
            source_file="proxy",
        )
    except (CaptureError, ValueError, RecursionError) as exc:
        # Not a chat exchange the checks can read (malformed JSON, a non-object request):
        # what the upstream answered decides.
        http_status = record.get("status")
        failing = transport or http_status is None or http_status >= 400
        unparsed = {
            "unparsed": redact_text(str(exc))[:500],
            "status": http_status,
            "request_headers": redact_headers(headers),
            "request_text": redact_text(record["request_body"][:4096].decode("utf-8", "replace")),
            "response_text": redact_text(body[:4096].decode("utf-8", "replace")),
        }
        return _Classified(unparsed, [], ["http-error"] if failing else [], {})
    if transport and exchange.error is None and not record.get("timed_out"):
        exchange.error = {
            "message": redact_text(str(record["transport_error"])),
            "type": "transport",
            "code": record.get("status"),
            "in_stream": False,
        }
    if record.get("upstream_truncated"):
        exchange.truncated = True
    findings = classify(exchange)
    kinds = sorted({f.kind for f in findings if not f.passed} & USER_FACING_KINDS)
    if transport and not kinds:
        kinds = ["timeout" if record.get("timed_out") else "http-error"]
    usage = _usage(exchange.response)
    if not usage and record.get("stream"):
        usage = _sse_timings(body.decode("utf-8", "replace"))
    return _Classified(exchange.to_dict(), [f.to_dict() for f in findings], kinds, usage)


def prepare(record: ExchangeRecord, *, keep_success: bool, replica: str) -> Prepared:
    """Redact, classify and compress one raw record from the hot path."""
    body = b"".join(record["response_chunks"])
    transport = record.get("transport_error") is not None and record.get("status") in (502, 504)
    status = None if transport else record.get("status")
    identity = record.get("identity") or {}
    classified = _classify(record, body, transport)
    exchange_dict, finding_dicts = classified.exchange, classified.findings
    kinds, usage = classified.kinds, classified.usage
    signature = failure_signature(kinds, status, transport=transport)
    model = identity.get("model") or ""
    if not model and exchange_dict and isinstance(exchange_dict.get("request"), dict):
        model = str(exchange_dict["request"].get("model") or "")
    failed = bool(signature)
    request = exchange_dict.get("request") if isinstance(exchange_dict, dict) else None
    shape = request_shape(str(record["path"]), request, stream=bool(record.get("stream")))
    configured = ""
    if failed and isinstance(exchange_dict, dict):
        configured = client_limit(request, exchange_dict.get("response"), kinds)
    payload: JsonObject = {
        "exchange": exchange_dict,
        # The failed findings only: the passed ones (a dozen per exchange) say nothing
        # the symptoms do not, and were most of an exported live incident's size.
        "findings": [f for f in finding_dicts if not f.get("passed", False)],
        "symptoms": kinds,
        "failed": failed,
        "live_key": record["key"],
        "signature": signature,
        "shape": shape,
        **({"client_limit": configured} if configured else {}),
        "upstream": identity,
        "client": redact_text(record.get("client") or "")[:200],
        "client_disconnected": bool(record.get("client_disconnected")),
    }
    recorded_at = datetime.fromtimestamp(record["at"], tz=timezone.utc)
    keep = failed or keep_success
    row: LiveRow = {
        "key": record["key"],
        "recorded_at": recorded_at,
        "replica": replica[:100],
        "path": record["path"][:200],
        "model": model[:300],
        "client": payload["client"],
        "signature": signature,
        "failed": failed,
        "status": record.get("status"),
        "elapsed_ms": record.get("elapsed_ms"),
        "stream": bool(record.get("stream")),
        "upstream_build": str(identity.get("build") or "")[:100],
        "template_sha256": str(identity.get("template_sha256") or "")[:64],
        "findings": kinds,
        "body": live.compress_body(payload) if keep else None,
        "body_truncated": bool(record.get("body_truncated")),
        "shape": shape[:100],
        "client_limit": configured[:200],
    }
    example: LiveExample | None = None
    if failed:
        example = {
            "kind": "exchange",
            "summary": f"live exchange {record['key'][:12]} via proxy: {signature}",
            "payload": payload,
            "source": f"proxy:{replica}",
            "recorded_at": recorded_at,
            "brief": _brief(payload, status),
        }
    return Prepared(row=row, kinds=kinds, example=example, usage=usage)


def _brief(payload: JsonObject, status: int | None) -> JsonObject:
    """The short form of a failing exchange's evidence (kb.repo.live keeps the first example of
    an incident whole and these for the others): what failed and how the reply ended, the
    body referenced by its live key instead of repeated (same prompt, same reply shape)."""
    exchange = payload.get("exchange") if isinstance(payload.get("exchange"), dict) else {}
    response = exchange.get("response") if isinstance(exchange, dict) else None
    reply: JsonObject = {"status": status}  # part of the evidence document as stored
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        reply["finish_reason"] = choice.get("finish_reason")
        for key in ("content", "reasoning_content"):
            value = message.get(key) if isinstance(message, dict) else None
            if isinstance(value, str):
                reply[f"{key}_chars"] = len(value)
        reply["tool_calls"] = len(message.get("tool_calls") or []) if message else 0
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        reply["usage"] = {k: v for k, v in usage.items() if isinstance(v, int)}
    keep = ("live_key", "signature", "symptoms", "shape", "client_limit", "client", "failed")
    return {
        **{key: payload[key] for key in keep if key in payload},
        "findings": [
            {"kind": f.get("kind"), "reason": f.get("reason")}
            for f in payload.get("findings") or []
        ],
        "reply": reply,
        "body": "not repeated here: stored by the proxy under live_key (liveexchange)",
    }
