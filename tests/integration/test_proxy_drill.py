"""The live proxy in front of the real llama-server b11434 serving the intermittent
gemma4-toolcall drill (T=1: the tool call leaks into the reasoning in ~30% of replies).

A client sends requests through the proxy; the proxy's failure rate (k/n, Wilson interval)
matches what the client itself saw and contains the drill's designed rate, exactly one
incident is opened, streamed and non-streamed clients get exactly the bytes the upstream
sent (checked against a TCP tap between the proxy and llama-server), and a client that
leaves mid-stream frees the llama-server slot.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select

from kb.models import Incident, utcnow
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.drills import Drill
from triage.llama.launcher import RunningServer
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, Recorder, serving
from triage.stats import wilson

pytestmark = pytest.mark.integration

N_REQUESTS = 60


@pytest.fixture(scope="module")
def drill_server(
    serve, toolcall_drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve(
        toolcall_drill.model, toolcall_drill.server_args, tmp_path_factory.mktemp("logs")
    ) as server:
        yield server


@pytest.fixture
def proxy(drill_server: RunningServer, tmp_path: Path) -> Iterator[tuple[str, Recorder, str]]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    metrics = ProxyMetrics()
    recorder = Recorder(
        url, spool_path=tmp_path / "spool.jsonl", metrics=metrics, replica="it", flush_seconds=0.05
    )
    app = ProxyApp(ProxyConfig(drill_server.base_url), recorder=recorder, metrics=metrics)
    with serving(app) as server:
        yield server.url, recorder, url


def _failed(reply: dict[str, Any]) -> bool:
    """The client's own check: the drill fails by answering without the tool call."""
    message = reply["choices"][0]["message"]
    return not message.get("tool_calls")


def test_proxy_measures_the_drill_rate_and_opens_one_incident(
    proxy: tuple[str, Recorder, str], toolcall_drill: Drill
) -> None:
    proxy_url, recorder, db_url = proxy
    body = toolcall_drill.request("sampled")

    def send(seed: int) -> dict[str, Any]:
        reply = httpx.post(
            f"{proxy_url}/v1/chat/completions",
            json={**body, "seed": seed},
            headers={"user-agent": "drill-client/1"},
            timeout=300,
        )
        assert reply.status_code == 200
        return reply.json()

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(send, range(1, N_REQUESTS + 1)))
    client_failures = sum(_failed(r) for r in replies)
    recorder.flush(N_REQUESTS)

    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            cells = live.cell_counts(
                session, utcnow().replace(year=2000), utcnow().replace(year=3000)
            )
            opened = liveincidents.live_incidents(session)
            incidents = session.exec(select(Incident)).all()
    finally:
        store.close()
    assert 0 < client_failures < N_REQUESTS, "the drill is intermittent at T=1"
    proxy_failures = sum(c.failures for c in cells)
    assert {c.n for c in cells} == {N_REQUESTS}
    assert proxy_failures == client_failures  # every failure the client saw, and no other
    interval = wilson(proxy_failures, N_REQUESTS)
    assert interval.low <= client_failures / N_REQUESTS <= interval.high
    designed = toolcall_drill.manifest["parameters"]["failure_rate"]["temperature_1"]
    wide = wilson(proxy_failures, N_REQUESTS, confidence=0.999)  # flakes < 1 in 1000
    assert wide.low <= designed <= wide.high, (proxy_failures, designed)
    assert len(incidents) == 1 and len(opened) == 1
    assert opened[0].model == toolcall_drill.model.name
    assert incidents[0].server_build.startswith("b11434")


# --------------------------------------------------------------------------- byte-exact


class Tap:
    """A TCP relay that keeps every byte llama-server sends back (one list per connection)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.received: list[bytearray] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        record = bytearray()
        self.received.append(record)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bytearray | None
        ) -> None:
            while data := await src.read(65536):
                if keep is not None:
                    keep.extend(data)
                dst.write(data)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(
                pipe(reader, up_writer, None),
                pipe(up_reader, writer, record),
                return_exceptions=True,
            )
        finally:
            writer.close()
            up_writer.close()

    def __enter__(self) -> Tap:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            self.server.close()
            await self.server.wait_closed()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def http_bodies(raw: bytes) -> list[bytes]:
    """The bodies of the HTTP/1.1 responses in one connection's bytes (de-chunked)."""
    bodies = []
    rest = raw
    while rest:
        head, _, rest = rest.partition(b"\r\n\r\n")
        headers = {
            line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")[1:]
            if b":" in line
        }
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = bytearray()
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk, rest = rest[:size], rest[size + 2 :]
                if size == 0:
                    break
                body.extend(chunk)
            bodies.append(bytes(body))
        else:
            length = int(headers.get(b"content-length", b"0"))
            bodies.append(rest[:length])
            rest = rest[length:]
    return bodies


def test_streamed_and_non_streamed_clients_get_exactly_the_upstream_bytes(
    drill_server: RunningServer, toolcall_drill: Drill, tmp_path: Path
) -> None:
    body = toolcall_drill.request("greedy")
    with Tap(drill_server.port) as tap:
        config = ProxyConfig(f"http://127.0.0.1:{tap.port}", identity_refresh_seconds=0)
        recorder = Recorder(f"sqlite:///{tmp_path / 'kb.db'}", spool_path=tmp_path / "s.jsonl")
        app = ProxyApp(config, recorder=recorder)
        with serving(app) as server:
            plain = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
            with httpx.stream(
                "POST",
                f"{server.url}/v1/chat/completions",
                json={**body, "stream": True},
                timeout=300,
            ) as response:
                streamed = b"".join(response.iter_raw())
    sent = [b for connection in tap.received for b in http_bodies(bytes(connection))]
    assert plain.status_code == 200 and plain.content in sent
    assert json.loads(plain.content)["choices"][0]["finish_reason"] == "tool_calls"
    assert streamed in sent and streamed.endswith(b"data: [DONE]\n\n")
    assert streamed.count(b"data: ") > 5  # a real stream, not one blob


# --------------------------------------------------------------------------- disconnect


def test_client_leaving_mid_stream_frees_the_slot(
    server_factory, toolcall_drill: Drill, tmp_path: Path
) -> None:
    server = server_factory(
        toolcall_drill.model, ["-c", "16384", "-np", "1", "-t", "1", "-tb", "1", "--metrics"]
    )
    app = ProxyApp(ProxyConfig(server.base_url, identity_refresh_seconds=0))
    # 16000 tokens whatever the model says: seconds of work for the one slot, unless the
    # request is cancelled when the client leaves.
    # (no tools: the streamed tool-call parser ends a long stream of calls with an error)
    endless = {
        "messages": [{"role": "user", "content": "Tell me about Paris."}],
        "max_tokens": 16000,
        "ignore_eos": True,
        "stream": True,
        "seed": 7,
    }
    with serving(app) as proxy_server:
        with httpx.stream(
            "POST", f"{proxy_server.url}/v1/chat/completions", json=endless, timeout=300
        ) as response:
            for chunk in response.iter_raw():
                if b"data: " in chunk:
                    break
        deadline = time.monotonic() + 120
        while _slot_busy(server.base_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        predicted = _server_metric(server.base_url, "llamacpp:tokens_predicted_total")
        assert 0 < predicted < 8000, f"the slot generated {predicted} tokens for a client that left"
        # and the one slot serves the next request
        reply = httpx.post(
            f"{proxy_server.url}/v1/chat/completions",
            json=toolcall_drill.request("greedy"),
            timeout=300,
        )
        assert reply.status_code == 200


def _slot_busy(base_url: str) -> bool:
    return bool(httpx.get(f"{base_url}/slots", timeout=10).json()[0]["is_processing"])


def _server_metric(base_url: str, name: str) -> float:
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"llama-server /metrics has no {name}")


# --------------------------------------------------------------------------- auto-diagnose


def test_auto_diagnose_runs_triage_against_the_given_stack_not_the_upstream(
    drill_server: RunningServer, toolcall_drill: Drill, tmp_path: Path
) -> None:
    """The proxy in front of the real drill server opens an incident for the drill's
    intermittent failure and starts `triage diagnose` on it against --stack (a server of its
    own, launched from the stack), and the run is recorded in that incident."""
    from kb.models import TriageRun
    from triage.proxy.diagnose import AutoDiagnose, check_stack

    stack = toolcall_drill.out_dir / "auto-diagnose-stack.toml"  # relative model paths
    stack.write_text(
        (toolcall_drill.out_dir / "stack.toml").read_text() + "\n[probes]\nmax_requests = 12\n"
    )
    check_stack(stack, drill_server.base_url, allow_upstream=False)  # not the upstream
    db_url = f"sqlite:///{tmp_path / 'kb.db'}"
    hook = AutoDiagnose(stack, tmp_path / "runs", database_url=db_url)
    recorder = Recorder(
        db_url, spool_path=tmp_path / "spool.jsonl", flush_seconds=0.05, on_incident=hook
    )
    app = ProxyApp(ProxyConfig(drill_server.base_url), recorder=recorder)
    body = toolcall_drill.request("sampled")
    try:
        with serving(app) as server:
            with ThreadPoolExecutor(4) as pool:
                replies = list(
                    pool.map(
                        lambda seed: httpx.post(
                            f"{server.url}/v1/chat/completions",
                            json={**body, "seed": seed},
                            timeout=300,
                        ),
                        range(100, 130),
                    )
                )
            recorder.flush(len(replies))
        assert all(r.status_code == 200 for r in replies)
        assert len(recorder.opened) == 1 and len(hook.started) == 1
        hook.wait(900)
    finally:
        hook.stop()
    slug = recorder.opened[0]["slug"]
    folder = tmp_path / "runs" / slug
    log_text = (folder / "diagnose.log").read_text(errors="replace")
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            incident = session.exec(select(Incident).where(Incident.slug == slug)).one()
            runs = session.exec(select(TriageRun).where(TriageRun.incident_id == incident.id)).all()
    finally:
        store.close()
    assert len(runs) == 1, log_text
    assert runs[0].finished_at is not None and runs[0].state in ("done", "partial"), log_text
    plan = json.dumps(runs[0].plan)
    assert drill_server.base_url not in plan and f":{drill_server.port}" not in plan
    assert toolcall_drill.models["qat"].name in plan  # the stack's own server
    diagnosis = json.loads((folder / "diagnosis.json").read_text())
    assert runs[0].result["incident"] == slug and diagnosis["run_id"] == runs[0].id
    assert diagnosis["stack"] == runs[0].result["stack"]


def test_auto_diagnose_never_replays_against_the_upstream_without_a_stack(
    drill_server: RunningServer, tmp_path: Path
) -> None:
    """`triage proxy --auto-diagnose` in front of the real server: refused at startup
    without --stack, and with a stack whose server is the upstream itself (unless
    --diagnose-upstream): no proxy runs, nothing is replayed against production."""
    import subprocess
    import sys

    production = tmp_path / "production.toml"
    production.write_text(f'[server]\nurl = "{drill_server.base_url}"\n')
    env = {**os.environ, "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}"}
    base = [sys.executable, "-m", "triage.cli", "proxy", "--upstream", drill_server.base_url]
    base += ["--listen", "127.0.0.1:0", "--auto-diagnose"]
    for extra, message in (
        ([], "--auto-diagnose needs --stack"),
        (["--stack", str(production)], "would replay against production"),
    ):
        done = subprocess.run(
            base + extra, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "kb.db").exists()  # no proxy started, nothing recorded
