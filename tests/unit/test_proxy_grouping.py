"""Issue 28 item 5: the proxy opens one incident per problem, not one per symptom set, never
against an empty comparison window of a handful of requests, and not for what the client
asked for (its own tiny max_tokens, a stop list that empties the reply) unless told to."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from live_records import budget, ok, stop_emptied, tiny_limit
from sqlmodel import select

from kb.domain import retrotext
from kb.domain.live import LiveAlarm
from kb.models import Incident, LiveExchange, LiveSignature, Symptom, utcnow
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.proxy import Recorder
from triage.proxy.grouping import (
    OpeningRules,
    client_limit,
    group_of,
    primary_symptom,
    request_shape,
)


def _run(
    tmp_path: Path, records: list[dict[str, Any]], opening: OpeningRules | None = None
) -> tuple[str, Recorder]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    recorder = Recorder(
        url,
        spool_path=tmp_path / "spool.jsonl",
        replica="r",
        flush_seconds=0.01,
        batch_size=4,  # several batches, as in real traffic
        opening=opening,
    )
    recorder.start()
    try:
        for record in records:
            recorder.submit(record)
        recorder.flush(len(records))
    finally:
        recorder.stop()
    return url, recorder


def _read(url: str) -> dict[str, Any]:
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            now = utcnow()
            return {
                "incidents": list(session.exec(select(Incident)).all()),
                "signatures": list(session.exec(select(LiveSignature)).all()),
                "symptoms": list(session.exec(select(Symptom)).all()),
                "exchanges": list(session.exec(select(LiveExchange)).all()),
                "listed": liveincidents.live_incidents(session),
                "cells": live.cell_counts(
                    session, now.replace(year=now.year - 1), now.replace(year=now.year + 1)
                ),
            }
    finally:
        store.close()


def test_a_tiny_max_tokens_the_reply_hit_is_recorded_and_shown_but_opens_nothing(
    tmp_path: Path,
) -> None:
    now = time.time()
    url, recorder = _run(tmp_path, [tiny_limit(f"t{i}", now + i * 0.01) for i in range(12)])
    state = _read(url)
    assert recorder.opened == [] and state["incidents"] == []
    assert len(state["exchanges"]) == 12
    assert all(row.failed and row.client_limit for row in state["exchanges"])
    (cell,) = state["cells"]
    assert (cell.signature, cell.failures, cell.n) == ("length-stop|2xx", 12, 12)
    assert "max_tokens 4" in cell.client_limit


def test_a_stop_list_that_empties_the_reply_opens_nothing(tmp_path: Path) -> None:
    now = time.time()
    url, recorder = _run(tmp_path, [stop_emptied(f"s{i}", now + i * 0.01) for i in range(12)])
    state = _read(url)
    assert recorder.opened == [] and state["incidents"] == []
    assert all("stop list" in row.client_limit for row in state["exchanges"])


def test_client_limits_open_an_incident_when_asked(tmp_path: Path) -> None:
    now = time.time()
    records = [tiny_limit(f"t{i}", now + i * 0.01) for i in range(12)]
    url, recorder = _run(tmp_path, records, OpeningRules(open_on_client_limits=True))
    assert len(recorder.opened) == 1
    assert len(_read(url)["incidents"]) == 1


def test_three_failures_against_an_empty_comparison_window_open_nothing(
    tmp_path: Path,
) -> None:
    now = time.time()
    records = [budget(f"b{i}", now + i * 0.01, content="") for i in range(3)]
    url, recorder = _run(tmp_path, records)
    assert recorder.opened == [] and _read(url)["incidents"] == []


def test_an_incident_opens_once_the_shape_has_its_minimum_window(tmp_path: Path) -> None:
    now = time.time()
    records = []
    for i in range(12):
        at = now + i * 0.01
        records.append(
            budget(f"b{i}", at, content="") if i % 3 == 0 else ok(f"o{i}", at, max_tokens=256)
        )
    url, recorder = _run(tmp_path, records)
    (opened,) = recorder.opened
    state = _read(url)
    (incident,) = state["incidents"]
    # Honest about the comparison: nothing earlier to compare with, said in words.
    assert "no exchange of this shape" in incident.summary
    assert "trailing 0/0" not in incident.summary
    # The title carries no count that would go stale.
    assert "/" not in incident.title.replace("chat.json", "")
    assert opened["detection"]["rate"]["n"] >= 10


def test_one_intermittent_failure_with_two_symptom_sets_is_one_incident(
    tmp_path: Path,
) -> None:
    now = time.time()
    records = []
    for i in range(24):
        at = now + i * 0.01
        if i % 4 == 0:
            records.append(budget(f"e{i}", at, content=""))
        elif i % 4 == 1:
            records.append(budget(f"p{i}", at, content="Yes"))
        else:
            records.append(ok(f"o{i}", at, max_tokens=256))
    url, recorder = _run(tmp_path, records)
    state = _read(url)
    assert len(recorder.opened) == 1
    (incident,) = state["incidents"]
    variants = sorted(row.signature for row in state["signatures"])
    assert variants == [
        "empty-content+length-stop+reasoning-exhausted-budget|2xx",
        "length-stop+reasoning-exhausted-budget|2xx",
    ]
    assert {row.incident_id for row in state["signatures"]} == {incident.id}
    assert {s.kind for s in state["symptoms"]} == {
        "empty-content",
        "length-stop",
        "reasoning-exhausted-budget",
    }
    (listed,) = state["listed"]
    assert sorted(listed.variants) == variants
    assert "reasoning-exhausted-budget" in incident.title


def test_primary_symptom_and_shape_are_stable_names() -> None:
    assert primary_symptom(["empty-content", "length-stop", "reasoning-exhausted-budget"]) == (
        "reasoning-exhausted-budget"
    )
    assert primary_symptom(["length-stop", "empty-content"]) == "empty-content"
    assert primary_symptom(["length-stop", "a-plugin-kind"]) == "a-plugin-kind"
    assert group_of("empty-content+length-stop+reasoning-exhausted-budget|2xx") == group_of(
        "length-stop+reasoning-exhausted-budget|2xx"
    )
    assert group_of("empty-content|2xx") != group_of("empty-content|5xx")
    assert request_shape("/v1/chat/completions", {"tools": [{}], "stop": "x"}, stream=True) == (
        "chat.stream.tools.stop"
    )
    assert request_shape("/v1/chat/completions", {"messages": []}, stream=False) == "chat.json"


@pytest.mark.parametrize(
    ("request_", "finish", "kinds", "expected"),
    [
        ({"max_tokens": 4}, "length", ["length-stop"], "max_tokens 4"),
        ({"max_tokens": 4000}, "length", ["length-stop"], "max_tokens 4000"),
        ({"max_tokens": 8}, "length", ["empty-content", "length-stop"], "no room"),
        # A real budget problem: thinking ate a normal limit -- not the client's doing.
        ({"max_tokens": 256}, "length", ["empty-content", "length-stop"], ""),
        ({"stop": ["x"]}, "stop", ["empty-content"], "stop list"),
        # No stop list: an empty reply is the server's.
        ({}, "stop", ["empty-content"], ""),
        # The limit was not reached: nothing the client configured explains it.
        ({"max_tokens": 4}, "stop", ["empty-content"], ""),
    ],
)
def test_client_limit_names_only_what_the_client_configured(
    request_: dict[str, Any], finish: str, kinds: list[str], expected: str
) -> None:
    response = {"choices": [{"finish_reason": finish, "message": {"content": ""}}]}
    found = client_limit(request_, response, kinds)
    assert (expected in found) if expected else found == ""


def test_a_title_with_a_stale_count_loses_it_when_the_count_moves(tmp_path: Path) -> None:
    """An incident opened before titles carried no count ("... (3/11 failing)") keeps no
    number that contradicts the latest one."""
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        with store.session() as session:
            row, _ = liveincidents.open_incident(
                session,
                LiveAlarm(
                    model="fake-model.gguf",
                    signature="empty-content|2xx",
                    kinds=("empty-content",),
                    title="Live: empty-content from fake-model.gguf (3/11 failing)",
                    summary="new failure",
                    upstream={"model": "fake-model.gguf"},
                    detection={"rate": {"failures": 3, "n": 11}},
                    examples=(),
                    opened_by="old-proxy",
                ),
            )
            liveincidents.update_detection(session, row, {"rate": {"failures": 10, "n": 47}})
        with store.session(readonly=True) as session:
            (incident,) = session.exec(select(Incident)).all()
            (listed,) = liveincidents.live_incidents(session)
    finally:
        store.close()
    assert incident.title == "Live: empty-content from fake-model.gguf"
    assert retrotext.failing_text(listed.detection).startswith("10/47 failing")
