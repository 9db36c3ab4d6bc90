"""Issue 18 item 4 on the real llama-server: a stack whose server demands `--api-key` is
diagnosed (the replays send the key, no HTTP 401), and the key reaches nothing the run
leaves behind: the SQLite file, the exported incident, the diagnosis JSON, the CLI output
or the run logs."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from triage.drills import build_drill

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

KEY = "wiring-apikey-5b7e0c93d14f"


def _with_api_key(stack: Path) -> None:
    text = stack.read_text()
    new = re.sub(r"^args = \[", f'args = ["--api-key", "{KEY}", ', text, count=1, flags=re.M)
    assert new != text, "the drill stack has an args line"
    stack.write_text(new)


def test_an_api_key_stack_is_diagnosed_and_the_key_is_stored_nowhere(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack = drill.out_dir / "stack.toml"
    _with_api_key(stack)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(drill.request("greedy")))
    db = tmp_path / "kb.db"
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": f"sqlite:///{db}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    cli = [sys.executable, "-m", "triage.cli"]
    out = tmp_path / "diagnosis.json"
    done = subprocess.run(
        [
            *cli,
            "diagnose",
            "--request",
            str(request),
            "--stack",
            str(stack),
            "--max-requests",
            "8",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stderr
    diagnosis = json.loads(out.read_text())
    assert diagnosis["reproduction"]["reproduced"] is True, diagnosis["reproduction"]
    baseline = {a["name"]: a for a in diagnosis["arms"]}["baseline"]
    assert baseline["failures"] == baseline["n"] >= 4  # every replay answered (no 401)
    assert "--api-key" in json.dumps(diagnosis)  # the flag is recorded, masked

    exported = subprocess.run(
        [*cli, "export", "--out", str(tmp_path / "export")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    assert list((tmp_path / "export").glob("*.md"))

    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for text in (done.stdout, done.stderr, exported.stdout, exported.stderr):
        assert KEY not in text
    leaked = [
        path
        for path in tmp_path.rglob("*")
        if path.is_file() and path != stack and KEY.encode() in path.read_bytes()
    ]
    # Nothing else holds it: not the run logs (the launcher masks its `# argv:` header),
    # not the server's own output.
    assert [str(p) for p in leaked] == []
    assert list((tmp_path / "home").rglob("*.log")), "the run logs were written and checked"
