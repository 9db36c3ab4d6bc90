"""The proxy under faults and abuse, on real sockets (loopback): an upstream killed
mid-reply, path tricks around the allow-list, slow and oversized request heads, too many
connections. The recorder's journal under SIGKILL is in test_proxy_journal.py."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_fakes import FakeUpstream
from test_proxy import rows

from kb.repo import live
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, Recorder, serving
from triage.proxy.guard import ClientLimits, connection_bound
from triage.proxy.server import ThreadedServer

DYING_UPSTREAM = Path(__file__).with_name("dying_upstream.py")


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serving(fake) as server:
        yield fake, server.url


@pytest.fixture
def proxy_for(tmp_path: Path) -> Iterator[Any]:
    started: list[ThreadedServer] = []
    recorders: list[Recorder] = []

    def make(upstream_url: str, **config: Any) -> tuple[ThreadedServer, ProxyApp]:
        metrics = ProxyMetrics()
        recorder = Recorder(
            f"sqlite:///{tmp_path / 'kb.db'}",
            spool_path=tmp_path / "spool.jsonl",
            metrics=metrics,
            flush_seconds=0.05,
            retry_seconds=0.2,
        )
        recorders.append(recorder)
        app = ProxyApp(
            ProxyConfig(upstream_url, identity_refresh_seconds=0, **config),
            recorder=recorder,
            metrics=metrics,
        )
        server = ThreadedServer(app).start()
        started.append(server)
        return server, app

    yield make
    for server in started:
        server.stop()


def _raw_request(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send `request` as is (no client library normalising the path) and read the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        reply = b""
        while True:
            part = sock.recv(65536)
            if not part:
                return reply
            reply += part


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET /v1/../slots HTTP/1.1",
        b"GET /v1/%2e%2e/slots HTTP/1.1",
        b"GET /v1/%2E%2E/slots HTTP/1.1",
        b"POST /v1/../slots/0?action=erase HTTP/1.1",
        b"GET /v1/./../metrics/../slots HTTP/1.1",
        b"GET /v1/..%2fslots HTTP/1.1",
        b"GET /v1/..%5cslots HTTP/1.1",
        b"GET /v1/..\\slots HTTP/1.1",
        b"GET /v1/%00/../../slots HTTP/1.1",
    ],
)
def test_paths_that_leave_the_allow_list_are_refused_and_never_forwarded(
    upstream: tuple[FakeUpstream, str], proxy_for: Any, request_line: bytes
) -> None:
    fake, upstream_url = upstream
    server, app = proxy_for(upstream_url)
    body = b'{"model": "ok"}'
    request = (
        request_line
        + b"\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    reply = _raw_request(server.port, request)
    assert _status(reply) in (400, 404), reply[:200]
    assert b'"error"' in reply
    assert [r["path"] for r in fake.requests if r["path"] != "/props"] == []
    assert b'triage_proxy_refused_total{reason="path"} 1.0' in app.metrics.exposition()


def test_a_dot_segment_path_inside_the_allow_list_is_forwarded_resolved(
    upstream: tuple[FakeUpstream, str], proxy_for: Any
) -> None:
    fake, upstream_url = upstream
    server, _ = proxy_for(upstream_url)
    request = b"GET /v1/chat/../models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    reply = _raw_request(server.port, request)
    assert _status(reply) == 200
    assert fake.requests[-1]["path"] == "/v1/models"


# --------------------------------------------------------------------------- upstream dies


@pytest.fixture
def dying_upstream(tmp_path: Path) -> Iterator[Any]:
    processes: list[subprocess.Popen[str]] = []

    def start(mode: str) -> tuple[subprocess.Popen[str], str]:
        port_file = tmp_path / f"port-{mode}"
        process = subprocess.Popen(
            [sys.executable, str(DYING_UPSTREAM), str(port_file), mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        for _ in range(500):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.02)
        return process, f"http://127.0.0.1:{port_file.read_text()}"

    yield start
    for process in processes:
        process.kill()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


def _stream_until_killed(url: str, body: dict[str, Any], upstream: Any) -> tuple[bytes, str]:
    """Read a reply through the proxy; SIGKILL the upstream once the first bytes are in.
    Returns what the client received and how its read ended ("clean" or the error)."""
    received = b""
    try:
        with httpx.stream("POST", url, json=body, timeout=30) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                if not received:
                    assert upstream.stdout.readline().strip() == "streaming"
                    upstream.send_signal(signal.SIGKILL)
                received += chunk
    except httpx.HTTPError as exc:
        return received, type(exc).__name__
    return received, "clean"


def test_an_upstream_killed_mid_stream_is_an_error_event_and_an_aborted_connection(
    dying_upstream: Any, proxy_for: Any, tmp_path: Path
) -> None:
    process, upstream_url = dying_upstream("sse")
    server, app = proxy_for(upstream_url)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    received, ending = _stream_until_killed(f"{server.url}/v1/chat/completions", body, process)
    assert ending == "RemoteProtocolError", "the client was told the cut stream was complete"
    assert b"[DONE]" not in received
    last_event = received.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last_event.startswith(b'data: {"error": {"code": 502')
    assert b"upstream closed mid-response" in last_event
    exposition = app.metrics.exposition().decode()
    assert 'triage_proxy_upstream_cut_total{path="/v1/chat/completions"} 1.0' in exposition
    app.recorder.flush(1)
    (row,) = rows(f"sqlite:///{tmp_path / 'kb.db'}")
    payload = live.decompress_body(row.body)
    assert payload is not None and payload["exchange"]["truncated"] is True


def test_an_upstream_killed_mid_body_is_an_aborted_connection_not_a_short_body(
    dying_upstream: Any, proxy_for: Any
) -> None:
    process, upstream_url = dying_upstream("json")
    server, app = proxy_for(upstream_url)
    received, ending = _stream_until_killed(
        f"{server.url}/v1/chat/completions", {"model": "m", "messages": []}, process
    )
    assert ending == "RemoteProtocolError"
    assert b'"error"' not in received  # not an event stream: nothing is added to the body
    assert b"triage_proxy_upstream_cut_total" in app.metrics.exposition()


# --------------------------------------------------------------------------- slow or big heads


def _read_until_closed(sock: socket.socket) -> bytes:
    reply = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return reply
        if not part:
            return reply
        reply += part


def test_a_client_dripping_header_lines_is_closed_after_the_head_timeout(
    upstream: tuple[FakeUpstream, str], proxy_for: Any
) -> None:
    fake, upstream_url = upstream
    server, app = proxy_for(upstream_url, client_limits=ClientLimits(header_timeout=1.0))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for number in range(40):  # at most 12 s of dripping
            time.sleep(0.3)
            try:
                sock.sendall(b"X-Drip-%d: still here\r\n" % number)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if select.select([sock], [], [], 0)[0]:
                closed = True
                break
        assert closed, "the proxy kept a dripping client's connection open"
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert [r for r in fake.requests if r["path"] != "/props"] == []
    assert b'triage_proxy_refused_total{reason="header-timeout"} 1.0' in app.metrics.exposition()


def test_a_client_that_never_finishes_its_body_is_closed_and_nothing_is_forwarded(
    upstream: tuple[FakeUpstream, str], proxy_for: Any
) -> None:
    fake, upstream_url = upstream
    server, app = proxy_for(upstream_url, client_limits=ClientLimits(body_timeout=1.0))
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            b'{"model": "ok"'
        )
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert [r for r in fake.requests if r["path"] != "/props"] == []
    assert b'reason="body-timeout"} 1.0' in app.metrics.exposition()


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-Many-%d: v\r\n" % i for i in range(500)),  # too many fields
        b"X-Big: " + b"a" * 200_000 + b"\r\n",  # one field over the size limit
    ],
    ids=["count", "size"],
)
def test_too_many_or_too_large_header_fields_are_a_431_never_forwarded(
    upstream: tuple[FakeUpstream, str], proxy_for: Any, headers: bytes
) -> None:
    fake, upstream_url = upstream
    server, app = proxy_for(upstream_url)
    body = b'{"model": "ok"}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + headers
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it had all of it
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    assert [r for r in fake.requests if r["path"] != "/props"] == []
    assert b'reason="headers-too-large"} 1.0' in app.metrics.exposition()


def test_an_endless_header_line_is_a_431(
    upstream: tuple[FakeUpstream, str], proxy_for: Any
) -> None:
    _, upstream_url = upstream
    server, _ = proxy_for(upstream_url)
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        try:
            for _ in range(64):  # up to 4 MB, never a line end
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]


def test_connections_over_the_bound_get_a_503_at_once(
    upstream: tuple[FakeUpstream, str], proxy_for: Any
) -> None:
    fake, upstream_url = upstream
    server, app = proxy_for(upstream_url, client_limits=ClientLimits(max_connections=5))
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(5)]
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            reply = _read_until_closed(extra)
        assert reply.startswith(b"HTTP/1.1 503"), reply[:100]
        # The connections already open are served as usual.
        idle[0].sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_until_closed(idle[0]).startswith(b"HTTP/1.1 200")
    finally:
        for sock in idle:
            sock.close()
    assert b'reason="connections"} 1.0' in app.metrics.exposition()


def test_the_connection_bound_leaves_file_descriptors_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert connection_bound(1024) == 512
    assert connection_bound(100) == 100


# --------------------------------------------------------------------------- long SSE


def test_a_transcript_of_60000_events_is_reassembled_whole() -> None:
    from triage.capture import parse_sse_streams

    pieces = [f"p{i % 10}" for i in range(60_000)]
    text = "".join(
        'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % p for p in pieces
    )
    text += 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    (exchange,) = parse_sse_streams(text, file="long.sse")
    assert exchange.response is not None
    choice = exchange.response["choices"][0]
    assert choice["message"]["content"] == "".join(pieces)
    assert choice["finish_reason"] == "stop" and exchange.truncated is False
