"""The triage engine against a real llama-server running the shared drill models.

Verdicts are checked against each drill's manifest (its ground truth), never against
numbers tuned to one run.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.stackfile import load_stack

# Each test launches several real servers; on a loaded 2-core machine that takes minutes.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _by_cause(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in diagnosis["causes"]}


def _arms(diagnosis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in diagnosis["arms"]}


def _no_leaked_servers() -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []


def _assert_matches_manifest(diagnosis: dict[str, Any], manifest: dict[str, Any]) -> None:
    verdicts = _by_cause(diagnosis)
    for cause_id, truth in manifest["causes"].items():
        assert verdicts[cause_id]["status"] in truth["accept"], (
            cause_id,
            verdicts[cause_id],
            truth,
        )


def test_thinking_budget_drill_verdicts_match_the_manifest(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("greedy")),
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
    ).to_json()
    validate_diagnosis(diagnosis)
    _assert_matches_manifest(diagnosis, drill.manifest)
    verdicts, arms = _by_cause(diagnosis), _arms(diagnosis)
    assert verdicts["reasoning-exhausts-budget"]["status"] == "confirmed"
    assert verdicts["quantized-weights"]["status"] == "rejected"
    assert verdicts["speculative-decoding"]["status"] != "confirmed"
    # k/n with an interval on every arm, the deciding arms with enough samples.
    baseline, off = arms["baseline"], arms["thinking-off"]
    assert baseline["failures"] == baseline["n"] >= 4  # deterministic at temperature 0
    assert off["decision"] == "removes"
    assert off["failures"] == 0 and off["n"] >= 4 and off["p_value"] < 0.05
    assert off["ci95"][1] < baseline["ci95"][0]
    # Speculative decoding: its own rate evidence and a divergence observation.
    assert arms["spec-off"]["decision"] == "unchanged"
    assert 0 < arms["baseline"]["draft_acceptance"] < 1
    observations = {o["name"]: o for o in diagnosis["observations"]}
    assert observations["spec-divergence"]["seeds"] >= 1
    assert observations["template-render"]["thinking_on"] is True
    assert observations["template-render"]["thinking_on_with_enable_thinking_false"] is False
    assert observations["weights-confounder"]["differs"] == []
    # Every verdict that is not "untestable" cites evidence that exists in the KB.
    from kb.repo.files import load_record

    with store.session(readonly=True) as session:
        record = load_record(session, diagnosis["incident"])
    keys = {e["id"] for e in record["evidence"]}
    for cause in diagnosis["causes"]:
        assert set(cause["evidence"]) <= keys
    history = {c["id"]: c["history"] for c in record["causes"]}
    assert history["reasoning-exhausts-budget"][-1]["to"] == "confirmed"
    assert history["reasoning-exhausts-budget"][-1]["actor"] == "engine"
    store.close()
    _no_leaked_servers()


def test_toolcall_drill_intermittent_failure_verdicts(server_binary: Path, tmp_path: Path) -> None:
    drill = build_drill("gemma4-toolcall", tmp_path / "drill")
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("sampled")),
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=64, log_dir=tmp_path / "runs"),
    ).to_json()
    store.close()
    validate_diagnosis(diagnosis)
    _assert_matches_manifest(diagnosis, drill.manifest)
    arms = _arms(diagnosis)
    # Intermittent: the baseline fails sometimes, never always, and it took more samples
    # than the two looks (8) a deterministic failure takes (issue 15: three failing pairs now
    # decide "unchanged", so 12 can be enough; it was 16 or more with the earlier bet).
    assert 0 < arms["baseline"]["failures"] < arms["baseline"]["n"]
    assert arms["baseline"]["n"] > 8
    _no_leaked_servers()


def _wrapper(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text("#!/usr/bin/env bash\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_speculative_decoding_confirmed_when_it_changes_the_failure_rate(
    server_binary: Path, tmp_path: Path
) -> None:
    # On CPU, speculative decoding is token-identical to plain decoding, so this stand-in
    # changes what the server commits on purpose: with a draft model it runs the drill as
    # is (thinking loops, fails); without one it runs with reasoning off (succeeds).
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    standin = _wrapper(
        tmp_path,
        "llama-server-standin",
        f"""
for a in "$@"; do [ "$a" = "-md" ] && exec "{server_binary}" "$@"; done
exec "{server_binary}" "$@" --reasoning off
""",
    )
    stack_text = (
        (drill.out_dir / "stack.toml")
        .read_text()
        .replace("[server]\n", f'[server]\nbinary = "{standin}"\n')
    )
    stack_path = drill.out_dir / "stack-standin.toml"
    stack_path.write_text(stack_text)
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("greedy")),
        load_stack(stack_path),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
    ).to_json()
    store.close()
    verdicts, arms = _by_cause(diagnosis), _arms(diagnosis)
    assert arms["spec-off"]["decision"] == "removes"
    assert verdicts["speculative-decoding"]["status"] == "confirmed"
    _no_leaked_servers()


def test_a_server_that_crashes_mid_arm_is_recorded_and_the_rest_goes_on(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    # A stand-in build that crashes: it starts the real server, waits until it is healthy,
    # then kills it (exit code 3) -- the arm must be recorded as errored, not hang.
    crasher = _wrapper(
        tmp_path,
        "llama-server-crash",
        f"""
"{server_binary}" "$@" &
child=$!
port=""
prev=""
for a in "$@"; do [ "$prev" = "--port" ] && port="$a"; prev="$a"; done
for i in $(seq 1 200); do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.05
done
sleep 0.3
echo "simulated crash: killing the server" >&2
kill -9 $child
exit 3
""",
    )
    text = (drill.out_dir / "stack.toml").read_text() + f'binary = "{crasher}"\n'
    stack_path = drill.out_dir / "stack-crash.toml"
    stack_path.write_text(text)
    stack = load_stack(stack_path)
    assert stack.alternate_binary == crasher
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("greedy")),
        stack,
        options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs", request_timeout=30),
    ).to_json()
    # A run that ended with errors says so, and can be resumed.
    from triage.engine import unfinished_run

    assert diagnosis["state"] == "partial"
    unfinished = unfinished_run(store, diagnosis["incident"])
    assert unfinished is not None and unfinished.id == diagnosis["run_id"]
    store.close()
    arms, verdicts = _arms(diagnosis), _by_cause(diagnosis)
    assert arms["alt-build"]["decision"] == "errored"
    assert arms["alt-build"]["error"]
    assert verdicts["server-build"]["status"] == "suspected"
    assert any("alt-build" in line for line in diagnosis["undecided"])
    # The other arms still decided.
    assert verdicts["reasoning-exhausts-budget"]["status"] == "confirmed"
    _no_leaked_servers()


def test_cli_diagnose_writes_valid_json_and_resume_continues_an_interrupted_run(
    server_binary: Path, tmp_path: Path
) -> None:
    from triage.demo import capture_failing_exchange

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack_path = drill.out_dir / "stack.toml"
    request_path, response_path = capture_failing_exchange(
        stack_path, drill.request("greedy"), tmp_path
    )
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    argv = [
        sys.executable,
        "-m",
        "triage.cli",
        "diagnose",
        "--request",
        str(request_path),
        "--response",
        str(response_path),
        "--stack",
        str(stack_path),
        "--max-requests",
        "16",
    ]
    # Interrupt a first run once its second look started (the baseline's first look and
    # one arm's are recorded by then): waiting for that progress line, not for a time, so
    # a slow machine only makes the test slower (issue 28 item 11: a deadline ran out on a
    # loaded host, the run finished uninterrupted, and there was nothing to resume).
    first = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert first.stderr is not None
    seen: list[str] = []
    for line in first.stderr:
        seen.append(line)
        if " probe " in f" {line.strip()} " and "look 2/" in line:
            first.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail("the run ended before its second look:\n" + "".join(seen[-20:]))
    _, rest = first.communicate(timeout=120)
    assert first.returncode != 0
    assert "recorded as interrupted" in rest, "".join(seen[-5:]) + rest
    before = _reply_count(tmp_path / "kb.db")
    assert before >= 6
    _assert_no_llama_children(tmp_path)
    out = tmp_path / "diagnosis.json"
    done = subprocess.run(
        [*argv[:4], "--resume", "--stack", str(stack_path), "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    diagnosis = json.loads(out.read_text())
    validate_diagnosis(diagnosis)
    assert _by_cause(diagnosis)["reasoning-exhausts-budget"]["status"] == "confirmed"
    assert "CONFIRMED" in done.stdout and "reasoning-exhausts-budget" in done.stdout
    assert _reply_count(tmp_path / "kb.db") > before
    _assert_no_llama_children(tmp_path)


def _reply_count(db: Path) -> int:
    if not db.exists():
        return 0
    import sqlite3

    try:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM evidence WHERE kind = 'probe'").fetchone()
            return int(row[0])
    except sqlite3.OperationalError:
        return 0


def _assert_no_llama_children(tmp_path: Path) -> None:
    result = subprocess.run(
        ["pgrep", "-f", f"llama-server.*{tmp_path}"], capture_output=True, text=True
    )
    assert result.stdout.strip() == ""


def test_a_wrapper_binary_and_its_server_child_are_both_stopped(
    server_binary: Path, tmp_path: Path
) -> None:
    # A configured `binary` may be a wrapper that starts llama-server as a child; stopping
    # the launch must take the whole process group down, not just the wrapper.
    from triage.llama.launcher import ServerSpec, launch

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    wrapper = _wrapper(
        tmp_path,
        "llama-server-wrapper",
        f"""
"{server_binary}" "$@" &
wait
""",
    )
    spec = ServerSpec(wrapper, drill.model, ["-c", "2048", "-np", "1"])
    with launch(spec, tmp_path / "logs") as server:
        assert server.alive()
        children = subprocess.run(
            ["pgrep", "-f", f"llama-server -m {drill.model}"], capture_output=True, text=True
        ).stdout.split()
        assert children
    for _ in range(50):
        left = subprocess.run(
            ["pgrep", "-f", f"llama-server -m {drill.model}"], capture_output=True, text=True
        ).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == []


def test_known_good_search_names_the_dimension_that_brings_the_failure_back(
    server_binary: Path, tmp_path: Path
) -> None:
    """A [known_good] configuration that differs from the failing one in two dimensions
    (reasoning off in the other flags, no speculative decoding): the search reverts each on
    its own server and finds the one that removes the failure, with real replays."""
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack_file = drill.out_dir / "stack.toml"
    stack_file.write_text(
        stack_file.read_text()
        + '\n[known_good]\nmodel = "gemma4-thinking-budget-qat.gguf"\n'
        + 'args = ["-c", "16384", "-np", "4", "-t", "1", "-tb", "1", "--reasoning", "off"]\n'
    )
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("greedy")),
        load_stack(stack_file),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
    ).to_json()
    validate_diagnosis(diagnosis)
    search = next(o for o in diagnosis["observations"] if o["name"] == "known-good-search")
    assert search["arms"] == {
        "known-good:revert-other-args": "removes",
        "known-good:revert-spec-flags": "unchanged",
        "known-good": "removes",
    }
    assert search["needed_to_reproduce"] == ["other-args"]
    arms = _arms(diagnosis)
    assert arms["known-good:revert-other-args"]["failures"] == 0
    assert (
        arms["known-good:revert-spec-flags"]["failures"]
        == arms["known-good:revert-spec-flags"]["n"]
        >= 4
    )
    _no_leaked_servers()
