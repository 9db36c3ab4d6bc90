"""What travels through the proxy: one exchange as the forwarder hands it over, and one
incident the recorder opened.

`ExchangeRecord` is built by the forwarder (`triage.proxy.forward`), filled in while the
reply streams (`triage.proxy.relay`), journaled (`triage.proxy.journal`), queued to the
recorder (a thread, or pickled to the recorder process) and prepared for the store
(`triage.proxy.prepare`). It stays a plain dict on the hot path -- built as one literal,
set key by key as the reply arrives, pickled and journaled as is -- typed here so every
reader names the same fields.

`OpenedIncident` is what the recorder reports for each incident it opened (`Recorder.opened`,
the `on_incident` hook: auto-diagnose).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from kb.jsontypes import JsonObject
from kb.service.live import DetectionFacts

__all__ = ["ExchangeRecord", "HeaderPairs", "OpenedIncident", "UpstreamIdentity", "record_size"]

HeaderPairs = list[tuple[bytes, bytes]]
"""Header names and values as raw bytes, in the order they came."""


class UpstreamIdentity(TypedDict, total=False):
    """Who answered: the upstream's model, build and chat template hash (from /props); a
    record's is empty until the reply's headers are in."""

    model: str
    build: str
    template_sha256: str


class ExchangeRecord(TypedDict):
    """One forwarded exchange: bytes as on the wire plus what the forwarder measured."""

    key: str  # idempotency key (a uuid4 hex): one stored row per key
    at: float  # wall-clock time the request arrived (epoch seconds)
    method: str
    path: str  # normalised (triage.proxy.forward.normalise_path)
    recordable: bool  # a POST under /v1/: the exchanges the recorder stores
    request_body: bytes
    request_headers: HeaderPairs  # as sent upstream (hop-by-hop ones dropped)
    client: str  # the client's User-Agent
    status: int | None  # None until the upstream's status line (or the proxy's own error)
    response_headers: HeaderPairs
    response_chunks: list[bytes]  # the first `max_record_bytes` of the reply body
    elapsed_ms: float | None
    ttfb_ms: float | None
    timed_out: bool
    transport_error: str | None  # the upstream could not be reached or cut the reply off
    client_disconnected: bool
    body_truncated: bool  # the reply was longer than the record keeps
    upstream_truncated: bool  # the upstream closed mid-reply
    stream: bool  # an SSE reply
    identity: UpstreamIdentity
    # Hand-overs from the relay to the forwarder, removed before the record is submitted
    # (never journaled, never recorded): why the reply was cut, and the proxy's own share
    # of the last byte's latency.
    _cut: NotRequired[str]
    _tail_seconds: NotRequired[float]


def record_size(record: ExchangeRecord) -> int:
    """The bytes a queued record holds in memory (request and reply bodies)."""
    return len(record.get("request_body") or b"") + sum(
        len(chunk) for chunk in record.get("response_chunks") or ()
    )


class OpenedIncident(TypedDict):
    """An incident the recorder opened: the hook's argument, `Recorder.opened`'s items."""

    slug: str
    model: str
    signature: str  # the problem's main signature
    problem: str  # the problem key (symptom group x request shape)
    detection: DetectionFacts  # the change detection that opened it
    example: JsonObject | None  # the last failing exchange's evidence payload, as stored
