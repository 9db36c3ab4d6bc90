"""`triage diagnose` on a capture of several exchanges, on the real llama-server: the
prompt-cache-timestamp drill's five turns (the time first in the system prompt) and a chat
UI's title request after the first, conversed on the real server and exported as one HAR
session. The command diagnoses the last turn, reads the four turns before it (not the title
request) as its conversation -- every pair shares only "<system>Current time: 2026-12-01T17:0"
of more than 1,500 characters, and each captured reply's timings.cache_n is a few tokens -- and
confirms prompt-cache, no other cause. Every server is stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from triage.drills import build_drill
from triage.drills.prompt_cache import NAME, record_session
from triage.llama.launcher import running_servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_a_har_session_is_diagnosed_as_a_conversation(server_binary: Path, tmp_path: Path) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    session = record_session(drill, tmp_path / "capture")
    out = tmp_path / "diagnosis.json"
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "triage.cli",
            "diagnose",
            "--request",
            str(session),
            "--stack",
            str(drill.out_dir / "stack.toml"),
            "--max-requests",
            "8",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert out.exists(), done.stderr[-3000:]
    # Which exchange, and why: nothing fails, so the last one (the fifth turn).
    assert "6 exchanges; diagnosing exchange 6 ($.log.entries[5])" in done.stderr
    assert "its conversation in the capture: 5 turns" in done.stderr
    diagnosis = json.loads(out.read_text("utf-8"))
    sequence = [
        f
        for f in diagnosis["findings"]
        if f["kind"] == "unstable-prefix" and "turns of one conversation" in f["reason"]
    ]
    assert len(sequence) == 1 and not sequence[0]["passed"]
    reason = sequence[0]["reason"]
    assert "(exchanges 1, 3, 4, 5, 6)" in reason  # the title request (2) is not a turn
    assert "4 of 4 consecutive turns share no prefix" in reason
    # "<system>" + "Current time: 2026-12-01T17:0" (37 characters), then the minute differs.
    pairs = reason.split("the turn before's: ")[1].split(" (*")[0].split(", ")
    assert [pair.split("/")[0] for pair in pairs] == ["37"] * 4
    assert all(pair.endswith("*") and int(pair[3:-1]) > 1500 for pair in pairs)
    assert sequence[0]["where"] == "$.request.messages[0].content"
    # The replies' own timings are the evidence: a few tokens of thousands from the cache.
    per_turn = reason.split("timings.cache_n/prompt tokens): ")[1].split(";")[0].split(", ")
    cached = [int(item.split("/")[0]) for item in per_turn]
    totals = [int(item.split("/")[1].split(" ")[0]) for item in per_turn]
    assert len(cached) == 5 and all(t > 1000 for t in totals[1:])
    assert all(c < 0.1 * t for c, t in zip(cached[1:], totals[1:], strict=True))
    causes = {c["id"]: c for c in diagnosis["causes"]}
    assert causes["prompt-cache"]["status"] == "confirmed"
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["prompt-cache"]
    assert running_servers() == []
