"""The live proxy against a scripted upstream on a real socket: forwarding byte for byte,
streaming without buffering, cancellation on disconnect, the faults (upstream down or slow,
database down, restart), recording, redaction and incident opening (SQLite here; two
replicas on PostgreSQL in test_proxy_replicas.py; the real llama-server in
tests/integration/test_proxy_drill.py)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_fakes import FakeUpstream, chat_reply
from sqlmodel import select

from kb.models import Evidence, Incident, LiveExchange
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, Recorder, serving
from triage.proxy.server import ThreadedServer

SECRET = "sk-live-0123456789abcdefABCDEF"


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serving(fake) as server:
        yield fake, server.url


class Proxy:
    def __init__(self, app: ProxyApp, recorder: Recorder, server: ThreadedServer) -> None:
        self.app, self.recorder, self.server = app, recorder, server
        self.url = server.url


ProxyFactory = Callable[..., Proxy]


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'kb.db'}"


@pytest.fixture
def make_proxy(tmp_path: Path, db_file: str) -> Iterator[ProxyFactory]:
    started: list[ThreadedServer] = []

    def make(
        upstream_url: str,
        *,
        database: str | None = None,
        recorder_options: dict[str, Any] | None = None,
        **config: Any,
    ) -> Proxy:
        metrics = ProxyMetrics()
        options = {"flush_seconds": 0.05, "retry_seconds": 0.2, **(recorder_options or {})}
        recorder = Recorder(
            database or db_file,
            spool_path=tmp_path / "spool.jsonl",
            metrics=metrics,
            replica="test",
            **options,
        )
        app = ProxyApp(
            ProxyConfig(upstream_url, identity_refresh_seconds=0, **config),
            recorder=recorder,
            metrics=metrics,
        )
        server = ThreadedServer(app).start()
        started.append(server)
        return Proxy(app, recorder, server)

    yield make
    for server in started:
        server.stop()


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def rows(db_url: str) -> list[LiveExchange]:
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            return list(session.exec(select(LiveExchange)).all())
    finally:
        store.close()


# --------------------------------------------------------------------------- forwarding


def test_non_streamed_reply_is_the_upstreams_bytes_status_and_headers(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    _, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    body = json.dumps(chat("ok")).encode()
    headers = {"content-type": "application/json"}
    direct = httpx.post(f"{upstream_url}/v1/chat/completions", content=body, headers=headers)
    proxied = httpx.post(f"{proxy.url}/v1/chat/completions", content=body, headers=headers)
    assert proxied.status_code == direct.status_code == 200
    assert proxied.content == direct.content
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert proxied.headers["content-length"] == direct.headers["content-length"]
    health = httpx.get(f"{proxy.url}/health")
    assert health.json() == {"status": "ok"} and health.headers["x-upstream"] == "yes"
    assert httpx.get(f"{proxy.url}/v1/models").json()["data"][0]["id"] == "fake-model.gguf"
    assert httpx.get(f"{proxy.url}/props").json()["build_info"] == "b11434-fake"
    refused = httpx.get(f"{proxy.url}/slots")
    assert refused.status_code == 404 and "forwards /v1/*" in refused.json()["error"]["message"]


def test_client_headers_reach_the_upstream_without_httpx_defaults(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    fake, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    with httpx.Client(headers={"user-agent": "agent/1.0"}) as client:
        client.post(
            f"{proxy.url}/v1/chat/completions?x=1",
            json=chat("ok"),
            headers={"x-custom": "kept", "connection": "keep-alive"},
        )
    seen = fake.requests[-1]["headers"]
    assert seen["user-agent"] == "agent/1.0"
    assert seen["x-custom"] == "kept"
    assert "proxy-connection" not in seen


def test_stream_is_forwarded_chunk_by_chunk_before_the_upstream_finishes(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    fake, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    received = b""
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=chat("gated"), timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        for chunk in response.iter_raw():
            received += chunk
            # The upstream holds the rest until the client has the first chunk: a proxy
            # that buffered would never deliver it (the gate times out after 10 s).
            if b"Hel" in received:
                fake.release.set()
    assert not fake.gate_timed_out
    assert received.endswith(b"data: [DONE]\n\n")
    direct = httpx.post(f"{upstream_url}/v1/chat/completions", json=chat("stream"))
    assert received == direct.content


def test_client_disconnect_cancels_the_upstream_request(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    fake, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=chat("endless"), timeout=30
    ) as response:
        for chunk in response.iter_raw():
            if b"la" in chunk:
                break
    assert fake.cancelled.wait(10), "the upstream kept streaming after the client left"
    proxy.recorder.flush(1)
    (row,) = rows(db_file)
    payload = live.decompress_body(row.body)
    assert payload is not None and payload["client_disconnected"] is True


# --------------------------------------------------------------------------- faults


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_upstream_down_is_a_502_json_error_recorded_as_a_transport_failure(
    make_proxy: ProxyFactory, db_file: str
) -> None:
    proxy = make_proxy(f"http://127.0.0.1:{_closed_port()}")
    reply = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("ok"))
    assert reply.status_code == 502
    assert "upstream unreachable" in reply.json()["error"]["message"]
    proxy.recorder.flush(1)
    (row,) = rows(db_file)
    assert row.failed and row.signature == "http-error|transport"


def test_slow_upstream_is_a_504_recorded_as_a_timeout(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    fake, upstream_url = upstream
    fake.slow_seconds = 3.0
    proxy = make_proxy(upstream_url, read_timeout=0.3)
    reply = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("slow"), timeout=30)
    assert reply.status_code == 504
    assert reply.json()["error"]["message"] == "upstream timed out"
    proxy.recorder.flush(1)
    (row,) = rows(db_file)
    assert row.failed and row.signature == "timeout|transport"


def test_malformed_request_gets_exactly_the_upstreams_answer(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    _, upstream_url = upstream
    proxy = make_proxy(upstream_url, max_request_bytes=4096)
    garbage = b'{"model": "ok", "messages": [\x00\xff'
    direct = httpx.post(f"{upstream_url}/v1/chat/completions", content=garbage)
    proxied = httpx.post(f"{proxy.url}/v1/chat/completions", content=garbage)
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)
    too_big = httpx.post(f"{proxy.url}/v1/chat/completions", content=b"x" * 5000)
    assert too_big.status_code == 413 and "4096 bytes" in too_big.json()["error"]["message"]
    proxy.recorder.flush(1)
    (row,) = rows(db_file)  # the refused one never reached the upstream: not an exchange
    assert row.status == 500 and row.signature == "http-error|5xx"


class _SwitchableStore:
    """A store factory whose database is down until `up` is set (a real refused connection)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.up = False
        self.down_url = f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/none"

    def __call__(self, _url: str | None) -> Store:
        return Store(self.url if self.up else self.down_url)


def test_database_down_spools_then_replays_everything_once(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str, tmp_path: Path
) -> None:
    _, upstream_url = upstream
    switch = _SwitchableStore(db_file)
    proxy = make_proxy(upstream_url, recorder_options={"store_factory": switch})
    for model in ("ok", "empty", "ok"):
        reply = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat(model))
        assert reply.status_code == 200  # proxying goes on without a database
    proxy.recorder.flush(3)
    assert proxy.recorder.spooled_count() == 3
    spool_text = (tmp_path / "spool.jsonl").read_text()
    assert SECRET not in spool_text
    switch.up = True
    httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("ok"))
    proxy.recorder.flush(4)
    stored = rows(db_file)
    assert len(stored) == 4 and len({r.key for r in stored}) == 4
    assert proxy.recorder.spooled_count() == 0
    assert sum(r.failed for r in stored) == 1


def test_a_restart_replaying_an_already_written_spool_stores_nothing_twice(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str, tmp_path: Path
) -> None:
    _, upstream_url = upstream
    switch = _SwitchableStore(db_file)
    proxy = make_proxy(upstream_url, recorder_options={"store_factory": switch})
    for _ in range(3):
        httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("empty"))
    proxy.recorder.flush(3)
    spool = tmp_path / "spool.jsonl"
    saved = spool.read_text()
    switch.up = True
    httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("ok"))
    proxy.recorder.flush(4)
    assert len(rows(db_file)) == 4
    # A crash after the replay committed but before the spool was emptied: the next
    # process finds the same lines again.
    spool.write_text(saved)
    restarted = Recorder(db_file, spool_path=spool, replica="restarted", retry_seconds=0.1)
    restarted.start()
    try:
        assert restarted._replay_spool()
    finally:
        restarted.stop()
    stored = rows(db_file)
    assert len(stored) == 4 and len({r.key for r in stored}) == 4
    assert spool.read_text() == ""


# --------------------------------------------------------------------------- recording


def test_secrets_never_reach_the_database(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    fake, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    reply = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json=chat("empty", api_key=SECRET),
        headers={"authorization": f"Bearer {SECRET}", "cookie": f"session={SECRET}"},
    )
    assert reply.status_code == 200
    assert fake.requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"  # forwarded
    proxy.recorder.flush(1)
    (row,) = rows(db_file)
    text = json.dumps(live.decompress_body(row.body))
    assert SECRET not in text and row.failed
    store = Store(db_file, migrate=False)
    try:
        with store.session(readonly=True) as session:
            for evidence in session.exec(select(Evidence)).all():
                assert SECRET not in json.dumps(evidence.payload)
    finally:
        store.close()


def test_successes_are_sampled_failures_always_kept(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    _, upstream_url = upstream
    proxy = make_proxy(upstream_url, recorder_options={"sample_successes": 0.0})
    for model in ("ok", "ok", "empty"):
        httpx.post(f"{proxy.url}/v1/chat/completions", json=chat(model))
    proxy.recorder.flush(3)
    stored = rows(db_file)
    assert len(stored) == 3  # every exchange counts in the rates
    assert [r.body is None for r in stored if not r.failed] == [True, True]
    (failed,) = [r for r in stored if r.failed]
    payload = live.decompress_body(failed.body)
    assert payload is not None
    assert payload["exchange"]["response"]["choices"][0]["message"]["content"] == ""
    assert payload["upstream"]["model"] == "fake-model.gguf"
    assert payload["upstream"]["build"] == "b11434-fake"
    assert failed.upstream_build == "b11434-fake" and len(failed.template_sha256) == 64


def test_repeated_failures_open_one_incident_with_rate_examples_and_upstream(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    _, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    with httpx.Client(headers={"user-agent": "coding-agent/2"}) as client:
        for i in range(12):
            client.post(f"{proxy.url}/v1/chat/completions", json=chat("empty" if i % 2 else "ok"))
            if i % 4 == 3:
                proxy.recorder.flush(i + 1)  # several batches, as in real traffic
    proxy.recorder.flush(12)
    store = Store(db_file, migrate=False)
    try:
        with store.session(readonly=True) as session:
            incidents = session.exec(select(Incident)).all()
            opened = liveincidents.live_incidents(session)
            cells = live.cell_counts(session, *_whole_day())
            evidence = session.exec(select(Evidence)).all()
    finally:
        store.close()
    assert len(incidents) == 1 and len(opened) == 1
    incident = incidents[0]
    assert incident.status == "open" and incident.server_build == "b11434-fake"
    assert incident.stack["upstream"]["model"] == "fake-model.gguf"
    assert opened[0].signature == "empty-content|2xx"
    assert opened[0].first_exchange and opened[0].latest_exchange
    assert opened[0].first_exchange != opened[0].latest_exchange
    assert "CI" in incident.summary and "/" in incident.summary
    assert [(c.client, c.signature, c.failures, c.n) for c in cells] == [
        ("coding-agent/2", "empty-content|2xx", 6, 12)
    ]
    assert all(e.kind == "exchange" and e.payload["failed"] for e in evidence)
    metrics = httpx.get(f"{proxy.url}/metrics").text
    failures = 'triage_proxy_failures_total{model="fake-model.gguf",signature="empty-content|2xx"}'
    assert f"{failures} 6.0" in metrics
    accepted = 'triage_proxy_draft_tokens_total{kind="accepted",model="fake-model.gguf"}'
    assert f"{accepted} 36.0" in metrics  # 12 replies x 3
    assert "triage_proxy_incidents_opened_total" in metrics
    assert "triage_proxy_request_duration_seconds_bucket" in metrics


def test_one_failure_opens_nothing(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str
) -> None:
    _, upstream_url = upstream
    proxy = make_proxy(upstream_url)
    for model in ["empty"] + ["ok"] * 5:
        httpx.post(f"{proxy.url}/v1/chat/completions", json=chat(model))
    proxy.recorder.flush(6)
    store = Store(db_file, migrate=False)
    try:
        with store.session(readonly=True) as session:
            assert liveincidents.live_incidents(session) == []
            assert session.exec(select(Incident)).all() == []
    finally:
        store.close()


def _whole_day() -> tuple[Any, Any]:
    from datetime import timedelta

    from kb.models import utcnow

    now = utcnow()
    return now - timedelta(days=1), now + timedelta(days=1)


def test_failures_after_parking_fire_the_parked_incidents_capture_trigger(
    db_file: str, tmp_path: Path
) -> None:
    import time as clock
    from datetime import timedelta

    from proxy_fakes import raw_record

    from kb.models import utcnow
    from kb.repo.decisions import parked, record_decision

    recorder = Recorder(db_file, spool_path=tmp_path / "spool.jsonl", replica="r")
    recorder.start()
    try:
        now = clock.time()
        for i in range(10):  # the minimum comparison window: 10 exchanges of the shape
            recorder.submit(
                raw_record(f"a{i}", "" if i % 2 else "A fine answer here.", at=now - 30 + i)
            )
        recorder.flush(10)
        (opened,) = recorder.opened
        store = Store(db_file, migrate=False)
        try:
            with store.session() as session:
                record_decision(
                    session,
                    opened["slug"],
                    "PARKED",
                    rationale="rare, tolerated",
                    by="on-call",
                    triggers=["failure-rate,min=3"],
                    at=utcnow() - timedelta(seconds=5),
                )
            with store.session(readonly=True) as session:
                assert not parked(session, utcnow().date())[0].due
        finally:
            store.close()
        for i in range(6):  # three more failures, recorded after the decision
            recorder.submit(
                raw_record(f"b{i}", "" if i % 2 else "A fine answer here.", at=clock.time() + 1 + i)
            )
        recorder.flush(16)
    finally:
        recorder.stop()
    assert len(recorder.opened) == 1  # the parked incident got the evidence, no new one
    store = Store(db_file, migrate=False)
    try:
        with store.session(readonly=True) as session:
            (item,) = parked(session, utcnow().date() + timedelta(days=1))
            incident = session.exec(select(Incident)).one()
            counts = live.incident_live_counts(
                session, incident.id, utcnow() - timedelta(hours=1), utcnow() + timedelta(minutes=1)
            )
    finally:
        store.close()
    assert item.due, item.reasons
    (trigger,) = [t for t in item.triggers if t.trigger["kind"] == "failure-rate"]
    # Unbiased: the proxy samples successes as evidence, so the rate comes from its counts.
    assert trigger.fired and "3/6 live exchanges failed since parked" in trigger.reason
    assert counts == (8, 16)


class _OneRequestPerConnection:
    """An HTTP/1.1 server that answers the first request of each connection with keep-alive
    and closes the connection, unanswered, when a second request arrives on it -- the race
    a pooled connection meets when llama-server (cpp-httplib) ends keep-alive."""

    def __init__(self, answer_delay: float = 0.0) -> None:
        self.answer_delay = answer_delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.answered = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            for number in (1, 2):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = (
                    int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                    if re.search(rb"(?i)content-length", head)
                    else 0
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                if number == 2:
                    self.dropped += 1
                    return  # closed without a response byte
                time.sleep(self.answer_delay)
                body = json.dumps(chat_reply("A complete answer from a fresh connection."))
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n"
                    b"connection: keep-alive\r\n\r\n" + body.encode()
                )
                self.answered += 1

    def close(self) -> None:
        self.sock.close()


def test_a_pooled_connection_the_upstream_closed_is_retried_not_a_502(
    make_proxy: ProxyFactory,
) -> None:
    server = _OneRequestPerConnection()
    try:
        proxy = make_proxy(f"http://127.0.0.1:{server.port}")
        with httpx.Client() as client:
            statuses = [
                client.post(f"{proxy.url}/v1/chat/completions", json=chat("ok")).status_code
                for _ in range(4)
            ]
    finally:
        server.close()
    assert statuses == [200] * 4
    assert server.dropped >= 1  # the race did happen, and the proxy sent the request again


def test_a_retry_never_meets_a_second_closed_pooled_connection(
    make_proxy: ProxyFactory,
) -> None:
    """With several idle pooled connections that the upstream has all closed (llama-server
    ending keep-alive on a burst of them), the retry must not take the next dead one from the
    pool: each client gets the upstream's answer, never a 502 nor a dropped connection."""
    server = _OneRequestPerConnection(answer_delay=0.3)
    try:
        proxy = make_proxy(f"http://127.0.0.1:{server.port}")
        url = f"{proxy.url}/v1/chat/completions"
        with ThreadPoolExecutor(4) as pool:  # four connections open at once, then pooled
            first = list(pool.map(lambda _: httpx.post(url, json=chat("ok"), timeout=30), range(4)))
        with httpx.Client(timeout=30) as client:
            later = [client.post(url, json=chat("ok")) for _ in range(4)]
    finally:
        server.close()
    assert [r.status_code for r in first + later] == [200] * 8
    direct = json.dumps(chat_reply("A complete answer from a fresh connection.")).encode()
    assert all(r.content == direct for r in first + later)
    assert server.dropped >= 2  # dead pooled connections were met, and none reached a client


def test_a_full_spool_drops_and_counts_instead_of_filling_the_disk(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, db_file: str, tmp_path: Path
) -> None:
    _, upstream_url = upstream
    switch = _SwitchableStore(db_file)
    proxy = make_proxy(
        upstream_url, recorder_options={"store_factory": switch, "max_spool_bytes": 6000}
    )
    for _ in range(6):
        assert httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("ok")).status_code == 200
    proxy.recorder.flush(6)
    kept = proxy.recorder.spooled_count()
    assert 0 < kept < 6
    assert (tmp_path / "spool.jsonl").stat().st_size <= 6000
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert f"triage_proxy_recording_dropped_total {float(6 - kept)}" in metrics


def test_a_spool_line_cut_by_a_crash_is_kept_aside_and_the_rest_replayed(
    db_file: str, tmp_path: Path
) -> None:
    import time as clock

    from proxy_fakes import raw_record

    from triage.proxy import prepare

    spool = tmp_path / "spool.jsonl"
    lines = [
        prepare(
            raw_record(f"s{i}", "An answer.", at=clock.time()), keep_success=True, replica="old"
        ).to_line()
        for i in range(3)
    ]
    spool.write_text(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])
    recorder = Recorder(db_file, spool_path=spool, replica="new")
    recorder.start()
    try:
        assert recorder._replay_spool()
    finally:
        recorder.stop()
    assert sorted(r.key for r in rows(db_file)) == ["s0", "s1"]
    assert (tmp_path / "spool.jsonl.bad").read_text() == lines[2][: len(lines[2]) // 2]
    assert spool.read_text() == ""


def test_public_surface() -> None:
    import triage.proxy

    assert sorted(triage.proxy.__all__) == sorted(
        name
        for name in dir(triage.proxy)
        if not name.startswith("_")
        and not isinstance(getattr(triage.proxy, name), type(triage.proxy))
    )


def test_the_recording_queue_is_bounded_in_bytes(db_file: str, tmp_path: Path) -> None:
    import time as clock

    from proxy_fakes import raw_record

    recorder = Recorder(db_file, spool_path=tmp_path / "spool.jsonl", queue_bytes=3000)
    record = raw_record("q0", "An answer.", at=clock.time())
    size = len(record["request_body"]) + len(record["response_chunks"][0])
    fits = 3000 // size
    accepted = [
        recorder.submit(raw_record(f"q{i}", "An answer.", at=clock.time())) for i in range(fits + 2)
    ]  # writer not started: nothing leaves the queue
    assert accepted == [True] * fits + [False, False]
    recorder.start()
    try:
        recorder.flush(fits)
        assert recorder.submit(raw_record("later", "An answer.", at=clock.time()))
        recorder.flush(fits + 1)
    finally:
        recorder.stop()
    assert len(rows(db_file)) == fits + 1


def test_the_overhead_histogram_counts_the_proxy_not_the_upstream(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    """/metrics separates what the proxy adds from what the upstream takes: a reply that the
    upstream holds for 0.3 s is 0.3 s of latency but only the proxy's own milliseconds of
    overhead (arrival to upstream call, last upstream byte to last byte written)."""
    from prometheus_client.parser import text_string_to_metric_families

    fake, upstream_url = upstream
    fake.slow_seconds = 0.3
    proxy = make_proxy(upstream_url)
    assert httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("slow")).status_code == 200
    streamed = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat("stream"))
    assert streamed.content.endswith(b"data: [DONE]\n\n")
    sums: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{proxy.url}/metrics").text):
        for sample in family.samples:
            if sample.name.endswith("_sum") and sample.labels.get("stream") == "false":
                sums[(family.name, sample.labels["path"])] = sample.value
            if sample.name == "triage_proxy_overhead_seconds_count":
                assert sample.value == 1.0  # one streamed and one plain request
    path = "/v1/chat/completions"
    assert sums[("triage_proxy_request_duration_seconds", path)] >= 0.3
    assert sums[("triage_proxy_overhead_seconds", path)] < 0.1


def test_a_stalled_event_loop_shows_in_the_lag_histogram(
    upstream: tuple[FakeUpstream, str],
) -> None:
    """A recorder that blocks the event loop for 0.3 s on each hand-over (what a writer
    holding the interpreter lock does, in small) is visible in /metrics as event-loop lag,
    which the overhead histogram cannot see (the stall happens outside any request's
    timing)."""

    class Blocking:
        def submit(self, record: dict[str, Any]) -> bool:
            time.sleep(0.3)
            return True

    _, upstream_url = upstream
    app = ProxyApp(ProxyConfig(upstream_url, identity_refresh_seconds=0), recorder=Blocking())
    server = ThreadedServer(app).start()
    buckets: dict[str, float] = {}
    try:
        before = _lag_buckets(httpx.get(f"{server.url}/metrics").text)
        late_before = before["+Inf"] - before["0.1"]
        httpx.post(f"{server.url}/v1/chat/completions", json=chat("ok"))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the probe records its late wake-up soon after
            buckets = _lag_buckets(httpx.get(f"{server.url}/metrics").text)
            if buckets["+Inf"] - buckets["0.1"] > late_before:
                break
            time.sleep(0.05)
    finally:
        server.stop()
    assert buckets["+Inf"] >= 2  # the probe runs continuously
    # one more wake-up came >= 0.1 s late: the stall
    assert buckets["+Inf"] - buckets["0.1"] > late_before


def _lag_buckets(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name == "triage_proxy_event_loop_lag_seconds":
            return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    return {}
