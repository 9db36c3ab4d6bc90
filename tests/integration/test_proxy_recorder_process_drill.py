"""`triage proxy` as users run it (the recorder in its own process, the default) in front of
the real llama-server b11434 serving the intermittent gemma4-toolcall drill: the proxy's
/metrics (fed by the recorder process) and its knowledge base count exactly the failures
the client saw, one incident is opened, and Ctrl-C on the process group stops everything.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select

from kb.models import Incident, utcnow
from kb.repo import live
from kb.repo.store import Store
from triage.drills import Drill
from triage.llama.launcher import RunningServer
from triage.proxy import detect

pytestmark = pytest.mark.integration

N_REQUESTS = 40


@pytest.fixture(scope="module")
def drill_server(
    serve, toolcall_drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve(
        toolcall_drill.model, toolcall_drill.server_args, tmp_path_factory.mktemp("logs")
    ) as server:
        yield server


def _metric(text: str, name: str) -> float:
    """Sum of a metric's samples (all label sets) in a Prometheus exposition."""
    pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.M))


def test_the_proxy_command_records_the_drill_through_its_recorder_process(
    drill_server: RunningServer, toolcall_drill: Drill, tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    db_url = f"sqlite:///{tmp_path / 'kb.db'}"
    argv = [sys.executable, "-m", "triage.cli", "proxy", "--upstream", drill_server.base_url]
    argv += ["--listen", f"127.0.0.1:{port}", "--spool", str(tmp_path / "spool.jsonl")]
    process = subprocess.Popen(
        argv,
        env={**os.environ, "TRIAGE_DATABASE_URL": db_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proxy = f"http://127.0.0.1:{port}"
    body = toolcall_drill.request("sampled")

    def send(seed: int) -> dict[str, Any]:
        reply = httpx.post(f"{proxy}/v1/chat/completions", json={**body, "seed": seed}, timeout=300)
        assert reply.status_code == 200
        return reply.json()

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{proxy}/health", timeout=30)
                break
            except httpx.ConnectError:
                assert process.poll() is None, "the proxy exited"
                assert time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.2)
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(send, range(1, N_REQUESTS + 1)))
        client_failures = sum(not r["choices"][0]["message"].get("tool_calls") for r in replies)
        deadline = time.monotonic() + 120
        while True:  # the recorder process classifies off the hot path: wait for it
            text = httpx.get(f"{proxy}/metrics", timeout=30).text
            if _metric(text, "triage_proxy_exchanges_total") >= N_REQUESTS:
                break
            assert time.monotonic() < deadline, "the recorder process did not catch up"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=120)[0].decode(errors="replace")
    assert process.returncode == 0, output
    assert 0 < client_failures < N_REQUESTS, "the drill is intermittent at T=1"
    assert _metric(text, "triage_proxy_exchanges_total") == N_REQUESTS
    assert _metric(text, "triage_proxy_failures_total") == client_failures
    assert _metric(text, "triage_proxy_tokens_total") > 0
    assert _metric(text, "triage_proxy_recording_dropped_total") == 0
    store = Store(db_url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            cells = live.cell_counts(
                session, utcnow().replace(year=2000), utcnow().replace(year=3000)
            )
            incidents = session.exec(select(Incident)).all()
    finally:
        store.close()
    assert sum(c.n for c in cells) == N_REQUESTS
    assert sum(c.failures for c in cells) == client_failures
    # Opened by the recorder process, counted in the parent's /metrics (in the same batch
    # message as the last exchanges, so already there). A batch tests the window up to its
    # last failure, at least as damning as the whole run: an alarm on the whole run means an
    # incident was opened.
    assert _metric(text, "triage_proxy_incidents_opened_total") == len(incidents)
    if detect(client_failures, N_REQUESTS, 0, 0).alarm:
        assert len(incidents) == 1 and incidents[0].server_build.startswith("b11434")
    else:
        assert len(incidents) <= 1
    assert "recorder process" in output and "SCHED_IDLE" in output
