"""Issue 11's "must show": a third-party plugin, installed as its own distribution
(tests/plugins/triage_example, `pip install`ed by this test), adds a capture format, a
symptom check, a cause and a server-level probe arm through its `triage.plugins` entry
point alone, and one `triage diagnose` of a real drill failure uses all four.

The plugin is installed into a folder of its own that only the diagnosing process sees
(PYTHONPATH), not into the suite's venv: an installed check runs on every capture, so in
the suite's venv it would add its kind to the findings other tests compare exactly with
the built-in vocabulary (e.g. the drill's failure kinds in test_capture_real.py, the
registered checks in test_symptom_plugins.py).

The drill is gemma4-thinking-budget: at max_tokens 800 the thought fills the budget
(finish `length`, no content). Its stack runs llama-server with `--reasoning-budget -1`
(unrestricted, the server's default, set explicitly: the plugin arm's opt-in); the plugin
arm restarts it with `--reasoning-budget 200`, after which the real server closes the
thought and the model answers.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from triage.drills import build_drill
from triage.drills.host import host_workaround_args

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PLUGIN = "triage-example-plugin"
FORMAT, CHECK, CAUSE, ARM = (
    "vgw",
    "all-thought-reply",
    "unbounded-reasoning-budget",
    "server-reasoning-budget",
)
CANARY = "sk-vgw-canary-5f1e0c9a77d24b3e"


PLUGIN_SOURCE = Path(__file__).resolve().parents[1] / "plugins" / "triage_example"


def _install_plugin(target: Path) -> dict[str, str]:
    """`pip install` the plugin distribution into `target`; the environment that makes a
    process see it (and its entry point) on top of the suite's venv."""
    # Built from a copy: the build leaves build/ and *.egg-info beside its pyproject.
    source = shutil.copytree(
        PLUGIN_SOURCE,
        target.parent / "plugin-src",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    paths = [str(target), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlib import metadata; d = metadata.distribution("
            f"{PLUGIN!r}); print(d.locate_file('').resolve()); print(sorted((e.group, e.name, "
            "e.value) for e in d.entry_points))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    where, entry_points = probe.stdout.splitlines()
    assert Path(where) == target.resolve()
    assert entry_points == "[('triage.plugins', 'example', 'triage_example')]"
    return env


def _stack(drill: Any) -> Path:
    """The drill's incident server, plain (no draft, no alternates: fewer launches), with
    the thinking budget set explicitly to llama-server's default, unrestricted."""
    args = [
        "-c",
        "16384",
        "-np",
        "4",
        "-t",
        "1",
        "-tb",
        "1",
        *host_workaround_args(),
        "--reasoning-budget",
        "-1",
    ]
    path = drill.out_dir / "stack-budget.toml"
    path.write_text(
        f"[server]\nmodel = {json.dumps(drill.model.name)}\nargs = {json.dumps(args)}\n", "utf-8"
    )
    return path


def _gateway_log(request_path: Path, response_path: Path, out: Path) -> Path:
    """What the vendor gateway logged for the failing call (one line per event)."""
    request = json.loads(request_path.read_text("utf-8"))
    response = json.loads(response_path.read_bytes())
    stamp = "2026-12-01T03:00:00Z"
    lines = [
        "# vendor gateway 3.2 -- export of tenant harbour",
        f"VGW/1 {stamp} r-0007 REQ POST /v1/chat/completions {json.dumps(request)}",
        f"VGW/1 {stamp} r-0007 HDR authorization: Bearer {CANARY}",
        f"VGW/1 {stamp} r-0007 HDR x-tenant: harbour",
        f"VGW/1 {stamp} r-0007 RES 200 9123ms {json.dumps(response)}",
    ]
    path = out / "gateway.log"  # no .vgw suffix: detection must sniff it
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def _record(db: Path, slug: str) -> dict[str, Any]:
    from kb.repo.files import load_record
    from kb.repo.store import Store

    store = Store(f"sqlite:///{db}")
    try:
        with store.session(readonly=True) as session:
            return load_record(session, slug)
    finally:
        store.close()


def _stored_text(db: Path) -> str:
    """Every text value in every table of the knowledge base, one string."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return "\n".join(str(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))


def test_a_plugin_alone_adds_format_check_cause_and_arm_to_a_real_diagnosis(
    server_binary: Path, tmp_path: Path
) -> None:
    from triage.catalogue import catalogue
    from triage.demo import capture_failing_exchange

    # Not in the suite's own process: only the diagnosing process below gets the plugin.
    assert FORMAT not in catalogue().formats and CAUSE not in catalogue().causes
    plugin_env = _install_plugin(tmp_path / "plugin-site")
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack_path = _stack(drill)
    # The real failing call, as the gateway in front of the server logged it.
    request_path, response_path = capture_failing_exchange(
        stack_path, drill.request("greedy"), tmp_path
    )
    log = _gateway_log(request_path, response_path, tmp_path)
    db, out = tmp_path / "kb.db", tmp_path / "diagnosis.json"
    env = {
        **plugin_env,
        "TRIAGE_DATABASE_URL": f"sqlite:///{db}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    # A fresh process: the catalogue comes from the installed entry points, nothing else.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "triage.cli",
            "diagnose",
            "--request",
            str(log),
            "--stack",
            str(stack_path),
            "--max-requests",
            "16",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    diagnosis = json.loads(out.read_text("utf-8"))
    text = done.stdout

    # 1. The capture format: the exchange was read by the plugin's parser (sniffed, no
    # --format), and its secret header was redacted before anything was stored.
    record = _record(db, diagnosis["incident"])
    evidence = {e["id"]: e for e in record["evidence"]}
    exchange = evidence[diagnosis["exchange_evidence"]]["payload"]["exchange"]
    assert exchange["source_format"] == FORMAT
    assert exchange["request"]["messages"] == drill.request("greedy")["messages"]
    assert exchange["response"]["choices"][0]["finish_reason"] == "length"
    for where in (_stored_text(db), out.read_text("utf-8"), text, done.stderr):
        assert CANARY not in where

    # 2. The symptom check: its finding is among the captured exchange's failed findings.
    failed = {f["kind"]: f for f in diagnosis["findings"] if not f["passed"]}
    assert CHECK in failed and "empty-content" in failed
    assert "reasoning" in failed[CHECK]["reason"]
    assert f"  - {CHECK}: " in text

    # 3. The server-level arm: launched with the bounded budget, k/n with an interval,
    # decided against a baseline that reproduced the captured failure (never one sample).
    arms = {a["name"]: a for a in diagnosis["arms"]}
    base, arm = arms["baseline"], arms[ARM]
    assert diagnosis["reproduction"]["reproduced"] is True
    assert base["failures"] == base["n"] >= 4  # greedy: every replay fails
    # The plugin kind on every failing baseline reply (the arm evidence's kind counts).
    assert evidence[base["evidence"]]["payload"]["kinds"][CHECK] == base["failures"]
    assert arm["level"] == "server" and "--reasoning-budget 200" in arm["variant"]
    assert arm["decision"] == "removes" and arm["failures"] == 0 and arm["n"] >= 4
    assert arm["p_value"] < 0.05 and arm["ci95"][1] < base["ci95"][0]
    # Under the bounded budget the real server closed the thought and the model answered.
    replies = [
        e["payload"]
        for e in record["evidence"]
        if e["payload"].get("type") == "reply" and e["payload"].get("arm") == ARM
    ]
    assert len(replies) == arm["n"]
    assert all(
        r["finish_reason"] == "stop" and r["content_chars"] > 0 and 0 < r["reasoning_chars"] < 2000
        for r in replies
    ), replies
    assert any(
        line.lstrip().startswith(ARM) and f"0/{arm['n']}" in line for line in text.splitlines()
    )

    # 4. The cause: confirmed by the plugin arm; no built-in cause rests on that arm.
    causes = {c["id"]: c for c in diagnosis["causes"]}
    assert causes[CAUSE]["status"] == "confirmed", causes[CAUSE]
    assert arm["evidence"] in causes[CAUSE]["evidence"]
    assert causes[CAUSE]["deciding_probe"] == ARM
    for cause_id, cause in causes.items():
        if cause_id != CAUSE:
            assert arm["evidence"] not in cause["evidence"], cause
    history = {c["id"]: c["history"] for c in record["causes"]}
    assert history[CAUSE][-1]["to"] == "confirmed"
    # The built-in verdict on this drill is unchanged by the plugin.
    assert causes["reasoning-exhausts-budget"]["status"] == "confirmed"
