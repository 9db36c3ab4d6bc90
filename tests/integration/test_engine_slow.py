"""Issue 28 item 2: a slow server is not a hung one. A real llama-server is made slow -- a
throttle stops its process group for 99 ms of every 100 (SIGSTOP/SIGCONT), a few hundred
tokens/s at most on any machine, less on a loaded one -- and diagnosed through a URL stack
whose replays need much longer than the first time limit (the token-limit arm asks 4x the
tokens). A fixed limit errored every such arm ("llama-server hung ... within Ns"); the
limits from the measured speed and the /slots progress watch wait for it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Diagnosis, validate_diagnosis
from kb.repo.store import Store
from triage.commands.engine import format_diagnosis
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.stackfile import parse_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

RUN_SECONDS = 0.001  # of every PERIOD the server may run
PERIOD = 0.1


THROTTLE = """
import os, signal, sys, time
pgid, run, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
while True:
    try:
        os.killpg(pgid, signal.SIGSTOP)
        time.sleep(period - run)
        os.killpg(pgid, signal.SIGCONT)
        time.sleep(run)
    except ProcessLookupError:
        break
"""


@contextlib.contextmanager
def _throttled(pgid: int) -> Iterator[None]:
    """A process of its own (no GIL shared with the engine) stops and continues the
    server's process group; the server is continued when it ends."""
    throttle = subprocess.Popen(
        [sys.executable, "-c", THROTTLE, str(pgid), str(RUN_SECONDS), str(PERIOD)]
    )
    try:
        yield
    finally:
        throttle.kill()
        throttle.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)


def test_a_slow_server_is_waited_for_and_never_called_hung(
    server_factory: Any, plain_args: list[str], tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    request = {**drill.request("greedy"), "max_tokens": 200}  # lifted: up to the slot
    server = server_factory(drill.model, plain_args)
    stack = parse_stack(f'[server]\nurl = "{server.base_url}"\n', base=tmp_path, source="s.toml")
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    events: list[str] = []
    with _throttled(server.pid):
        diagnosis = diagnose(
            store,
            Intake(request),
            stack,
            options=DiagnoseOptions(
                max_requests=8,
                request_timeout=1,
                replay_floor=1,
                stall_seconds=60,
                log_dir=tmp_path / "runs",
            ),
            progress=lambda event: events.append(event.message),
        ).to_json()
    store.close()
    validate_diagnosis(diagnosis)
    arms = {a["name"]: a for a in diagnosis["arms"]}
    text = format_diagnosis(Diagnosis.from_json(diagnosis))
    assert "hung" not in text and "server-hang" not in {
        o["name"] for o in diagnosis["observations"]
    }
    assert not [u for u in diagnosis["undecided"] if u.startswith("arm ")], diagnosis["undecided"]
    assert diagnosis["state"] == "done"
    # The token-limit arm (max_tokens lifted) got its replies (slow ones) and says what it found.
    x4 = arms["token-limit-lifted"]
    assert x4["n"] >= 4 and not x4.get("error")
    assert x4["decision"] in ("removes", "unchanged", "undecided") and x4["stopped"]
    assert all(a["n"] >= 4 for a in arms.values())
    # Replies took longer than the first limit: the watch, not luck, kept them.
    assert max(r for r in _elapsed(store_url=tmp_path / "kb.db")) > 1
    # No Python dict in what is printed.
    assert "{'" not in text and "{'" not in "\n".join(events)


def _elapsed(store_url: Path) -> list[float]:
    import json
    import sqlite3

    with sqlite3.connect(store_url) as conn:
        rows = conn.execute("SELECT payload FROM evidence WHERE kind = 'probe'").fetchall()
    payloads = [json.loads(row[0]) for row in rows]
    return [float(p.get("elapsed_s") or 0) for p in payloads if p.get("type") == "reply"]
