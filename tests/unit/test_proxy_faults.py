"""The proxy under faults and abuse, on real sockets (loopback): an upstream killed
mid-reply, path tricks around the allow-list, slow and oversized request heads, too many
connections. The recorder's journal under SIGKILL is in test_proxy_journal.py."""

from __future__ import annotations

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

from kb import live
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, Recorder, serving
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
