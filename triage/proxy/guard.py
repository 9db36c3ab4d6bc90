"""Bounds on what a client may make the proxy hold: time to send a request head and body,
the size and count of header fields, the number of open connections.

uvicorn (0.30-0.54) has none of these for its httptools protocol, which the proxy uses for
speed: `h11_max_incomplete_event_size` bounds the head only with the slower h11 protocol,
`timeout_keep_alive` only runs *between* requests, and `limit_concurrency` answers 503 only
once a request head is complete -- a client that never completes its head (slowloris) never
meets it, holds its connection and file descriptor forever, and one that sends 100,000
header lines has them all parsed and forwarded. Hence `guarded_protocol`: uvicorn's own
`HttpToolsProtocol` with, per connection,

- a head timer from the connection's start (for a next request on a kept-alive connection:
  from its first byte; before it, uvicorn's keep-alive timeout) to the end of the head: past
  `header_timeout`, 408 and close (a client dripping one header line every few seconds is
  closed, whatever it drips);
- a body timer from the end of the head to the end of the body: past `body_timeout`, 408
  (or only a close, if the response has started) -- the app sees a disconnect and forwards
  nothing;
- header fields counted and sized as they are parsed, and the bytes of an unfinished head
  counted as they arrive (one endless header line): past `max_header_count` or
  `max_header_bytes`, 431 and close;
- at most `max_connections` open connections (never more than half the process's open-file
  limit: each connection is a file descriptor, and the upstream pool and the journal need
  theirs): one more is answered 503 at once and closed.

Each refusal is counted in `triage_proxy_refused_total{reason=...}`. On the hot path this
costs two timer handles per request and a counter per header field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from triage.proxy.metrics import ProxyMetrics

log = logging.getLogger("triage.proxy")


@dataclass(frozen=True)
class ClientLimits:
    """What one client may take of the proxy."""

    header_timeout: float = 10.0
    body_timeout: float = 120.0
    max_header_count: int = 100
    max_header_bytes: int = 64 * 1024
    max_connections: int = 1024


class _HeadTooLarge(Exception):
    pass


_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _reply(status: int, message: str) -> bytes:
    body = json.dumps(
        {"error": {"code": status, "message": message, "type": "invalid_request_error"}}
    ).encode()
    return (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


def connection_bound(wanted: int) -> int:
    """`wanted`, lowered to half the soft open-file limit (at least 1)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return wanted
    return max(1, min(wanted, soft // 2))


def guarded_protocol(limits: ClientLimits, metrics: ProxyMetrics) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits` (see the module docstring)."""
    max_connections = connection_bound(limits.max_connections)
    if max_connections < limits.max_connections:
        log.info("at most %d client connections (half the open-file limit)", max_connections)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            self._in_head = True
            self._head_bytes = 0  # raw bytes of a head still unfinished
            self._field_bytes = 0  # target and header fields parsed
            self._header_count = 0
            self._refused = False

        # -- connections

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refuse(503, "connections", "the proxy has too many open connections")
                return
            self._arm(limits.header_timeout, self._head_timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _refuse(self, status: int, reason: str, message: str) -> None:
            if self._refused:
                return
            self._refused = True
            self._disarm()
            metrics.refused.labels(reason).inc()
            if not self.transport.is_closing():
                started = self.cycle is not None and self.cycle.response_started
                if not started:
                    self.transport.write(_reply(status, message))
                self.transport.close()

        # -- timers

        def _arm(self, seconds: float, callback: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _head_timed_out(self) -> None:
            self._timer = None
            if self._in_head:
                seconds = limits.header_timeout
                self._refuse(408, "header-timeout", f"request head not sent within {seconds:g} s")

        def _body_timed_out(self) -> None:
            self._timer = None
            if self.cycle is not None and self.cycle.more_body:
                seconds = limits.body_timeout
                self._refuse(408, "body-timeout", f"request body not sent within {seconds:g} s")

        # -- parsing

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _HeadTooLarge):
                    self._refuse(431, "headers-too-large", str(exc.__context__))
                    return
                message = "Invalid HTTP request received."
                self.logger.warning(message)
                self.send_400_response(message)
                return
            if self._in_head:
                # An unfinished head: count its bytes (one endless header line too).
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes:
                    size = limits.max_header_bytes
                    self._refuse(431, "headers-too-large", f"request head over {size} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._in_head:  # a next request on a kept-alive connection
                self._in_head = True
                self._head_bytes = self._field_bytes = self._header_count = 0
                self._arm(limits.header_timeout, self._head_timed_out)

        def on_url(self, url: bytes) -> None:
            self._count_field(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > limits.max_header_count:
                raise _HeadTooLarge(f"more than {limits.max_header_count} header fields")
            self._count_field(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_field(self, size: int) -> None:
            self._field_bytes += size
            if self._field_bytes > limits.max_header_bytes:
                raise _HeadTooLarge(f"request head over {limits.max_header_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_bytes = self._field_bytes = self._header_count = 0
            self._arm(limits.body_timeout, self._body_timed_out)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

    return GuardedHttpToolsProtocol
