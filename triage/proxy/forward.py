"""The forwarding half of the proxy: a raw ASGI app in front of llama-server.

`/v1/*`, `/props` and `/health` go to the upstream through one shared `aiohttp` connection
pool (its C HTTP parser costs a fraction of a pure-Python client per streamed chunk), byte
for byte: the request body as received, the response body as sent (raw bytes,
no decoding), status and headers intact except the hop-by-hop ones. Responses are streamed
through chunk by chunk as they arrive (SSE included); nothing is buffered before the client
gets it. A client that disconnects cancels the upstream request (its connection is closed,
so llama-server stops generating and frees the slot).

The proxy answers by itself only when the upstream cannot: 502 (unreachable) and 504 (no
response headers in time) as OpenAI-style JSON errors, 413 for a request body above the
cap, 404 for paths it does not forward. Each inference exchange (a POST under /v1/) is
handed to the recorder as a plain record (bytes and numbers); redaction, classification and
storage happen off the hot path (triage.proxy.recorder; by default in a process of its own at
idle CPU priority, triage.proxy.recorder_process).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import yarl

from triage.proxy.guard import ClientLimits
from triage.proxy.metrics import ProxyMetrics
from triage.proxy.record import ExchangeRecord, HeaderPairs, UpstreamIdentity
from triage.proxy.relay import Receive, Send, stream_body

log = logging.getLogger("triage.proxy")

Scope = dict[str, Any]

# RFC 9110 7.6.1 hop-by-hop fields, plus what the proxy recomputes (host, content-length of
# the request: the client library sets both from what it sends). Bytes, lower case: compared
# with the raw header names as they come (no decoding per header on the hot path).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length"}
# Headers aiohttp would add on its own: only what the client sent goes upstream (no default
# User-Agent or Accept, no Accept-Encoding: a compressed reply is not what the client asked
# for; no Content-Type guessed for a body sent without one).
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
FORWARDED_EXACT = frozenset({"/props", "/health"})
# Bytes that make a path need the slow normalisation (percent-encoding, dot segments,
# backslashes); a plain `/v1/chat/completions` skips it.
_UNUSUAL_PATH = re.compile(rb"[%\\\x00-\x20\x7f]|/\.")
# Characters kept as they are when a normalised path is re-encoded for the upstream.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024


class RecordSink(Protocol):
    def submit(self, record: ExchangeRecord) -> bool: ...


@dataclass
class ProxyConfig:
    """How the proxy reaches its upstream and what it accepts."""

    upstream: str
    connect_timeout: float = 5.0
    # Time allowed between two bytes from the upstream (and for the response headers).
    read_timeout: float = 600.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    identity_refresh_seconds: float = 60.0
    max_connections: int = 512
    # Bounds on the clients' side (head and body timeouts, header limits, open connections).
    client_limits: ClientLimits = field(default_factory=ClientLimits)
    replica: str = field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")

    def __post_init__(self) -> None:
        self.upstream = self.upstream.rstrip("/")
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream must be an http(s) URL, got {self.upstream!r}")


def identity_from_props(props: Any) -> UpstreamIdentity:
    """Model, build and chat template hash of a llama-server from its /props reply."""
    if not isinstance(props, dict):
        return {"model": "", "build": "", "template_sha256": ""}
    path = props.get("model_path") or ""
    model = props.get("model_alias") or path
    # llama-server's default alias is the model path: keep the file name only.
    if isinstance(model, str) and (model == path or model.endswith(".gguf")):
        model = os.path.basename(model)
    template = props.get("chat_template")
    template_hash = (
        hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) else ""
    )
    build = props.get("build_info") or ""
    return {
        "model": str(model)[:300],
        "build": str(build)[:100],
        "template_sha256": template_hash,
    }


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"code": status, "message": message, "type": kind}}).encode()


class PathRefused(ValueError):
    """A request path the proxy will not forward as such (400)."""


def normalise_path(raw_path: bytes) -> tuple[str, bytes]:
    """The path a request really names, as (decoded path, path to send upstream).

    Percent-decoded once, dot segments resolved (RFC 3986 5.2.4) -- so the allow-list sees
    `/slots` in `/v1/../slots` and `/v1/%2e%2e/slots`. Refused (PathRefused): an encoded
    slash or backslash (`%2f`, `%5c`: a segment boundary the upstream might see and the
    allow-list did not), a backslash, NUL or other control byte, a path not starting with
    `/`, or bytes that are not UTF-8 once decoded. A path without `%`, dot segments or
    backslashes is returned as is (the hot path)."""
    if not raw_path.startswith(b"/"):
        raise PathRefused("the path must start with /")
    if _UNUSUAL_PATH.search(raw_path) is None:
        return raw_path.decode("latin-1"), raw_path
    lowered = raw_path.lower()
    if b"%2f" in lowered or b"%5c" in lowered or b"\\" in raw_path:
        raise PathRefused("encoded slashes and backslashes are not allowed in the path")
    try:
        decoded = urllib.parse.unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise PathRefused("the path is not UTF-8 once percent-decoded") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
        raise PathRefused("control characters and NUL are not allowed in the path")
    segments: list[str] = []
    parts = decoded.split("/")[1:]
    for index, segment in enumerate(parts):
        last = index == len(parts) - 1
        if segment == ".":
            if last:
                segments.append("")
        elif segment == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        else:
            segments.append(segment)
    path = "/" + "/".join(segments)
    return path, urllib.parse.quote(path, safe=_PATH_SAFE).encode("ascii")


class UpstreamCut(Exception):
    """Raised out of the ASGI app to abort the client's connection: the upstream cut the
    response off (closed, or went quiet past the read timeout) after its status was sent.
    Ending the body normally would tell the client a cut reply was complete; raising makes
    uvicorn close the connection without the final chunk, which every HTTP client reports
    as an incomplete body."""


class _QuietUpstreamCut(logging.Filter):
    """uvicorn logs an exception that leaves the app with a traceback; an UpstreamCut is
    the proxy's deliberate abort (counted in /metrics and logged once by the proxy)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UpstreamCut)


_UVICORN_FILTER = _QuietUpstreamCut()


LAG_PROBE_SECONDS = 0.05


class ProxyApp:
    """ASGI app: forward, measure, hand exchanges to the recorder."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        recorder: Any | None = None,
        metrics: ProxyMetrics | None = None,
        transport: Any | None = None,
    ) -> None:
        """`transport`: an aiohttp connector to reach the upstream with (default: TCP)."""
        self.config = config
        self.recorder = recorder
        self.metrics = metrics or ProxyMetrics()
        self.identity: UpstreamIdentity = {"model": "", "build": "", "template_sha256": ""}
        self._transport = transport
        logging.getLogger("uvicorn.error").addFilter(_UVICORN_FILTER)  # once: a set
        self._client: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._lag_probe: asyncio.Task[None] | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=config.connect_timeout,
            sock_connect=config.connect_timeout,
            sock_read=config.read_timeout,
        )

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        config = self.config
        connector = self._transport or aiohttp.TCPConnector(
            limit=config.max_connections, limit_per_host=0, ttl_dns_cache=300
        )
        self._client = self._new_session(connector)
        # A retry after a dead pooled connection goes on a connection of its own: the pool
        # may hold more connections the upstream closed at the same moment.
        self._fresh = self._new_session(
            aiohttp.TCPConnector(limit=config.max_connections, force_close=True)
        )
        if self.recorder is not None and hasattr(self.recorder, "start"):
            self.recorder.start()
        await self.refresh_identity()
        if config.identity_refresh_seconds > 0:
            self._refresher = asyncio.create_task(self._refresh_loop())
        self._lag_probe = asyncio.create_task(self._lag_loop())

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        # Bytes through as received: no decompression, no cookies kept between clients.
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )

    async def shutdown(self) -> None:
        for task in (self._refresher, self._lag_probe):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for client in (self._client, self._fresh):
            if client is not None:
                await client.close()
        if self.recorder is not None and hasattr(self.recorder, "stop"):
            await asyncio.to_thread(self.recorder.stop)

    async def refresh_identity(self) -> None:
        """Read model, build and template hash from the upstream's /props (kept on failure)."""
        assert self._client is not None
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout)
        try:
            async with self._client.get(f"{self.config.upstream}/props", timeout=timeout) as reply:
                if reply.status == 200:
                    self.identity = identity_from_props(json.loads(await reply.read()))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("cannot read upstream /props: %s", type(exc).__name__)

    async def _lag_loop(self) -> None:
        """Event-loop lag, 20 times a second: how late a 50 ms sleep wakes up. A request that
        arrives while the loop is held up (by the recording writer's share of the interpreter
        lock, or a CPU it shares) waits that long before the proxy even reads it -- a delay
        the overhead histogram cannot see."""
        while True:
            started = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_SECONDS)
            late = time.perf_counter() - started - LAG_PROBE_SECONDS
            self.metrics.loop_lag.observe(max(late, 0.0))

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.identity_refresh_seconds)
            await self.refresh_identity()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # websockets are not forwarded: llama-server has none

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # noqa: BLE001 -- reported to the server, not raised
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.perf_counter()
        try:
            path, raw_path = normalise_path(scope.get("raw_path") or scope["path"].encode())
        except PathRefused as exc:
            self.metrics.refused.labels("path").inc()
            await _respond(send, 400, _error_body(400, str(exc), "invalid_request_error"))
            return
        # What the upstream is sent and what is recorded: the normalised path, never the
        # path as the client spelled it.
        scope["path"], scope["raw_path"] = path, raw_path
        if path == "/metrics" and scope["method"] == "GET":
            await _respond(send, 200, self.metrics.exposition(), self.metrics.content_type)
            return
        if not (path.startswith("/v1/") or path in FORWARDED_EXACT):
            self.metrics.refused.labels("path").inc()
            message = "triage proxy forwards /v1/*, /props and /health only"
            await _respond(send, 404, _error_body(404, message, "not_found_error"))
            return
        try:
            body = await _read_body(receive, self.config.max_request_bytes)
        except _ClientGone:
            return
        if body is None:
            limit = self.config.max_request_bytes
            message = f"request body exceeds the proxy's limit of {limit} bytes"
            await _respond(send, 413, _error_body(413, message, "invalid_request_error"))
            return
        await self._forward(scope, receive, send, body, arrived)

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, body: bytes, arrived: float
    ) -> None:
        assert self._client is not None, "the proxy was not started (lifespan)"
        started = time.perf_counter()
        wall = time.time()
        path: str = scope["path"]
        raw_path = scope.get("raw_path") or path.encode()
        query = scope.get("query_string") or b""
        url = self.config.upstream + raw_path.decode("latin-1")
        if query:
            url += "?" + query.decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in REQUEST_DROP]
        record = _record_start(scope, body, headers, wall)
        before_upstream = time.perf_counter()
        try:
            response = await self._send(scope["method"], url, headers, body)
        except asyncio.TimeoutError:
            await self._upstream_failed(send, record, 504, "upstream timed out", started, True)
            return
        except aiohttp.ClientError as exc:
            detail = f"upstream unreachable ({type(exc).__name__})"
            await self._upstream_failed(send, record, 502, detail, started, False)
            return
        ttfb = time.perf_counter() - started
        self.metrics.first_byte.labels(path).observe(ttfb)
        raw_headers = list(response.raw_headers)
        record["status"] = response.status
        record["response_headers"] = raw_headers
        record["ttfb_ms"] = ttfb * 1000
        record["identity"] = self.identity.copy()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(k, v) for k, v in raw_headers if k.lower() not in HOP_BY_HOP],
                }
            )
            await stream_body(
                response,
                receive,
                send,
                record,
                max_record_bytes=self.config.max_record_bytes,
                read_timeout=self.config.read_timeout,
            )
        finally:
            if response.content.at_eof():
                response.release()  # the connection goes back to the pool
            else:
                response.close()  # a client that left: llama-server stops and frees the slot
        elapsed = time.perf_counter() - started
        record["elapsed_ms"] = elapsed * 1000
        stream = "text/event-stream" in response.headers.get("content-type", "")
        record["stream"] = stream
        streamed = "true" if stream else "false"
        self.metrics.requests.labels(path, f"{response.status // 100}xx").inc()
        self.metrics.latency.labels(path, streamed).observe(elapsed)
        own = (before_upstream - arrived) + record.pop("_tail_seconds", 0.0)
        self.metrics.overhead.labels(path, streamed).observe(own)
        cut = record.pop("_cut", False)
        self._submit(record)
        if cut:
            self.metrics.upstream_cut.labels(path).inc()
            log.warning("%s: %s; the client's connection was aborted", path, cut)
            raise UpstreamCut(cut)

    async def _send(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> aiohttp.ClientResponse:
        """Send upstream; once more, on a new connection, if a pooled keep-alive connection
        turned out closed.

        llama-server (cpp-httplib) closes keep-alive connections after a number of requests
        or seconds idle, and closes the connection after each streamed reply although its
        headers say keep-alive; a request that meets such a connection gets no response
        byte at all (ServerDisconnectedError / a reset before the status line), so the
        upstream never saw it and sending it again is safe. The second attempt never takes
        a pooled connection: others in the pool may be just as dead, and a client must get
        the upstream's answer, not a 502. A refused connection is not retried."""
        assert self._client is not None and self._fresh is not None
        target = yarl.URL(url, encoded=True)  # the path and query exactly as the client sent
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        options: dict[str, Any] = {"allow_redirects": False, "data": body or None}
        try:
            return await self._client.request(method, target, headers=pairs, **options)
        except aiohttp.ClientConnectorError:
            raise
        except (
            aiohttp.ServerDisconnectedError,  # closed before the status line
            aiohttp.ClientOSError,  # reset while the request was written
            aiohttp.ClientConnectionResetError,  # written to a transport already closing
        ):
            pass
        return await self._fresh.request(method, target, headers=pairs, **options)

    async def _upstream_failed(
        self,
        send: Send,
        record: ExchangeRecord,
        status: int,
        message: str,
        started: float,
        timed_out: bool,
    ) -> None:
        body = _error_body(status, message, "upstream_error")
        try:
            await _respond(send, status, body)
        except OSError:
            record["client_disconnected"] = True
        elapsed = time.perf_counter() - started
        record["status"] = status
        record["elapsed_ms"] = elapsed * 1000
        record["transport_error"] = message
        record["timed_out"] = timed_out
        record["response_headers"] = [(b"content-type", b"application/json")]
        record["identity"] = self.identity.copy()
        record["response_chunks"].append(body)
        self.metrics.requests.labels(record["path"], "transport").inc()
        self.metrics.latency.labels(record["path"], "false").observe(elapsed)
        self._submit(record)

    def _submit(self, record: ExchangeRecord) -> None:
        if self.recorder is None or not record["recordable"]:
            return
        if not self.recorder.submit(record):
            self.metrics.recording_dropped.inc()


def _record_start(scope: Scope, body: bytes, headers: HeaderPairs, wall: float) -> ExchangeRecord:
    user_agent = ""
    for name, value in scope["headers"]:
        if name.lower() == b"user-agent":
            user_agent = value.decode("latin-1")
    path: str = scope["path"]
    return {
        "key": uuid.uuid4().hex,
        "at": wall,
        "method": scope["method"],
        "path": path,
        "recordable": scope["method"] == "POST" and path.startswith("/v1/"),
        "request_body": body,
        "request_headers": headers,
        "client": user_agent,
        "status": None,
        "response_headers": [],
        "response_chunks": [],
        "elapsed_ms": None,
        "ttfb_ms": None,
        "timed_out": False,
        "transport_error": None,
        "client_disconnected": False,
        "body_truncated": False,
        "upstream_truncated": False,
        "stream": False,
        "identity": {},
    }


class _ClientGone(Exception):
    """The client disconnected (or was closed for being too slow) before its body was in."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it exceeds `limit` bytes; _ClientGone when the
    connection ends first (a partial body is never forwarded)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _respond(
    send: Send, status: int, body: bytes, content_type: str = "application/json"
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
