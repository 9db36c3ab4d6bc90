"""Issue 28 item 5 on the real llama-server b11434 (the gemma4-toolcall drill model): what
the client configured -- a max_tokens of 2 that every reply hits, a stop list that ends the
reply before any content -- is recorded and shown through `triage proxy` but opens no
incident; asked to (`open_on_client_limits`), the proxy opens one. How the replies end
(finish_reason `length`, `stop` with empty content) is the real server's behaviour."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select

from kb.models import Incident, LiveExchange, utcnow
from kb.repo import live
from kb.repo.store import Store
from triage.drills import Drill
from triage.llama.launcher import RunningServer
from triage.proxy import ProxyApp, ProxyConfig, ProxyMetrics, Recorder, serving
from triage.proxy.grouping import OpeningRules

pytestmark = pytest.mark.integration

N = 12


@pytest.fixture(scope="module")
def drill_server(
    serve, toolcall_drill: Drill, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve(
        toolcall_drill.model, toolcall_drill.server_args, tmp_path_factory.mktemp("logs")
    ) as server:
        yield server


def _through_proxy(
    server: RunningServer, tmp_path: Path, bodies: list[dict[str, Any]], opening: OpeningRules
) -> tuple[list[dict[str, Any]], Recorder, str]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    metrics = ProxyMetrics()
    recorder = Recorder(
        url,
        spool_path=tmp_path / "spool.jsonl",
        metrics=metrics,
        replica="it",
        flush_seconds=0.05,
        opening=opening,
    )
    app = ProxyApp(ProxyConfig(server.base_url), recorder=recorder, metrics=metrics)
    replies = []
    with serving(app) as proxy:
        for body in bodies:
            reply = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=300)
            assert reply.status_code == 200, reply.text
            replies.append(reply.json())
        recorder.flush(len(bodies))
    return replies, recorder, url


def _rows(url: str) -> tuple[list[LiveExchange], list[Incident], list[live.CellCount]]:
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            return (
                list(session.exec(select(LiveExchange)).all()),
                list(session.exec(select(Incident)).all()),
                live.cell_counts(session, utcnow().replace(year=2000), utcnow().replace(year=3000)),
            )
    finally:
        store.close()


def _body(i: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"Write a long story about the sea, part {i}."}]
    return {"messages": messages, "temperature": 0, "seed": i, **extra}


def test_a_tiny_max_tokens_opens_no_incident_unless_asked(
    drill_server: RunningServer, tmp_path: Path
) -> None:
    bodies = [_body(i, max_tokens=2) for i in range(N)]
    replies, recorder, url = _through_proxy(drill_server, tmp_path / "a", bodies, OpeningRules())
    assert all(r["choices"][0]["finish_reason"] == "length" for r in replies)
    rows, incidents, cells = _rows(url)
    assert len(rows) == N and all(row.failed and row.client_limit for row in rows)
    assert recorder.opened == [] and incidents == []
    assert cells and all("max_tokens 2" in cell.client_limit for cell in cells)

    asked = OpeningRules(open_on_client_limits=True)
    _, recorder, url = _through_proxy(drill_server, tmp_path / "b", bodies, asked)
    assert len(recorder.opened) == 1 and len(_rows(url)[1]) == 1


def test_a_stop_list_that_empties_the_reply_opens_no_incident(
    drill_server: RunningServer, tmp_path: Path
) -> None:
    def reply(**extra: Any) -> dict[str, Any]:
        answer = httpx.post(
            f"{drill_server.base_url}/v1/chat/completions", json=_body(0, **extra), timeout=300
        ).json()
        return dict(answer["choices"][0]["message"])

    # The drill model thinks first: a stop on the reasoning's first word shows the raw text
    # generated before it (the thought's opening markup); a stop list holding the start of
    # that text ends every reply before anything is written.
    first_word = (reply(max_tokens=8).get("reasoning_content") or "").split()
    assert first_word, "the drill model did not think"
    raw = (reply(max_tokens=8, stop=[first_word[0]]).get("content") or "").strip()
    assert raw, "nothing was generated before the reasoning's first word"
    stop = raw[:5]
    bodies = [_body(0, max_tokens=8, stop=[stop]) for _ in range(N)]
    replies, recorder, url = _through_proxy(drill_server, tmp_path, bodies, OpeningRules())
    assert all(not (r["choices"][0]["message"].get("content") or "").strip() for r in replies), (
        stop,
        replies[0],
    )
    assert all(r["choices"][0]["finish_reason"] == "stop" for r in replies)
    rows, incidents, _ = _rows(url)
    assert all(row.failed for row in rows), [row.findings for row in rows]
    assert all("stop list" in row.client_limit for row in rows)
    assert recorder.opened == [] and incidents == []
