"""The proxy in front of the real llama-server b11434 when it dies mid-stream (SIGKILL, as a
crash or the OOM killer ends it): the client gets an SSE error event and an aborted
connection -- never a clean end of stream it would take for a finished reply."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from triage.drills import Drill
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, serving

pytestmark = pytest.mark.integration


def test_llama_server_killed_mid_stream_is_cut_for_the_client(
    server_factory: object, toolcall_drill: Drill, tmp_path: Path
) -> None:
    server = server_factory(toolcall_drill.model)  # type: ignore[operator]
    metrics = ProxyMetrics()
    app = ProxyApp(ProxyConfig(server.base_url, identity_refresh_seconds=0), metrics=metrics)
    body = {
        "messages": [{"role": "user", "content": "Count from one to a thousand."}],
        "stream": True,
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    received = b""
    ending = "clean"
    with serving(app) as proxy:
        try:
            with httpx.stream(
                "POST", f"{proxy.url}/v1/chat/completions", json=body, timeout=120
            ) as response:
                assert response.status_code == 200
                for chunk in response.iter_raw():
                    # The drill model writes ~5,000 tokens/s: kill at the first event, while
                    # most of the 4,000 tokens asked for are still to come.
                    if not received:
                        server.process.send_signal(signal.SIGKILL)
                    received += chunk
        except httpx.RemoteProtocolError:
            ending = "aborted"
    assert b'"finish_reason":"length"' not in received, "llama-server finished before the kill"
    assert ending == "aborted", "the client was told the cut stream was complete"
    assert b"[DONE]" not in received
    last_event = received.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last_event.startswith(b'data: {"error": {"code": 502'), last_event[:200]
    assert b"triage_proxy_upstream_cut_total" in metrics.exposition()
