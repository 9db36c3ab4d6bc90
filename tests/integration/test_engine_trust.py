"""Verdicts you can trust (issue 12), against a real llama-server running drill models:
the reproduction gate, speculative decoding seen on a URL stack, failed launches."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import select

from kb.domain.diagnosis import Finding
from kb.models import Incident
from kb.repo.files import load_record
from kb.repo.store import Store
from triage.capture import exchange_from_http
from triage.drills import build_drill
from triage.engine import DiagnoseOptions, EngineError, Intake, diagnose
from triage.llama.model_lint import LINT_KINDS
from triage.stackfile import load_stack, parse_stack
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _no_leaked_servers() -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []


def _findings(exchange) -> list[Finding]:  # type: ignore[no-untyped-def]
    return [f.record() for f in classify(exchange)]


def test_a_proxy_502_capture_is_not_reproduced_and_moves_no_cause(
    server_binary: Path, tmp_path: Path
) -> None:
    # Defect 3: the capture is a proxy's 502 page; the replays fail with length stops.
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    request = drill.request("greedy")
    exchange = exchange_from_http(request, b"<html><body>502 Bad Gateway</body></html>", status=502)
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(request, exchange=exchange.to_dict(), findings=tuple(_findings(exchange))),
        load_stack(drill.out_dir / "stack.toml"),
        options=DiagnoseOptions(max_requests=16, log_dir=tmp_path / "runs"),
    ).to_json()
    assert diagnosis["state"] == "not-reproduced"
    message = diagnosis["reproduction"]["message"]
    assert "did not reproduce" in message and "5xx" in message and "length-stop" in message
    assert all(c["status"] == c["previous_status"] == "suspected" for c in diagnosis["causes"])
    assert diagnosis["arms"] == []  # no arm ran, no baseline arm recorded
    with store.session(readonly=True) as session:
        record = load_record(session, diagnosis["incident"])
    # Every cause still has only its "candidate" history entry.
    assert all(len(c["history"]) == 1 for c in record["causes"])
    store.close()
    _no_leaked_servers()


def test_speculative_decoding_on_a_url_stack_is_seen_from_the_replies(
    server_binary: Path, tmp_path: Path
) -> None:
    # Defect 4: a URL stack whose server runs a draft model is not "not enabled".
    from triage.llama.launcher import ServerSpec, launch

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    stack = load_stack(drill.out_dir / "stack.toml")
    assert stack.speculative
    spec = ServerSpec(server_binary, Path(str(stack.server.model)), list(stack.server.args))
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    events: list[str] = []
    with launch(spec, tmp_path / "logs") as running:
        url_stack = parse_stack(
            f'[server]\nurl = "{running.base_url}"\n', base=tmp_path, source="url-stack.toml"
        )
        diagnosis = diagnose(
            store,
            Intake(drill.request("greedy")),
            url_stack,
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
            progress=lambda event: events.append(f"{event.stage} {event.message}"),
        ).to_json()
    with store.session(readonly=True) as session:
        incident = session.exec(select(Incident)).one()
    store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    speculative = causes["speculative-decoding"]
    assert diagnosis["stack"]["speculative"] is True
    assert speculative["status"] == "suspected"
    assert "not enabled" not in speculative["rationale"]
    assert "URL" in speculative["rationale"]
    # Issue 28 item 4: named after the model the server reports (/props), not its host.
    model = Path(str(stack.server.model)).stem
    assert incident.model == model and incident.title.startswith(f"{model}: ")
    assert "127-0-0" not in incident.slug and "127.0.0" not in incident.title
    assert incident.slug.split("-", 3)[3].startswith(model.lower().replace("_", "-")[:20])
    # Item 6: triage did not start this server, and says so.
    assert not any("starting the incident's server" in e for e in events)
    assert any(e.startswith("launch using the running server at http://127.0.0.1") for e in events)
    _no_leaked_servers()


def _wrapper(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "llama-server-broken"
    script.write_text("#!/usr/bin/env bash\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_failed_launch_leaves_no_incident_or_reuses_the_named_one(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    broken = _wrapper(tmp_path, 'echo "error: unknown argument: --typo" >&2\nexit 1\n')
    text = (
        (drill.out_dir / "stack.toml")
        .read_text()
        .replace("[server]\n", f'[server]\nbinary = "{broken}"\n')
    )
    stack_path = drill.out_dir / "stack-broken.toml"
    stack_path.write_text(text)
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    options = DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs", ready_timeout=20)
    with pytest.raises(EngineError, match="did not start"):
        diagnose(
            store, Intake(drill.request("greedy")), load_stack(stack_path), options=options
        ).to_json()
    with store.session(readonly=True) as session:
        assert session.exec(select(func.count()).select_from(Incident)).one() == 0
    store.close()
    _no_leaked_servers()


def test_a_server_that_crashes_unless_no_repack_confirms_cpu_backend(
    server_binary: Path, tmp_path: Path
) -> None:
    # Defect 7 on any host: a stand-in that segfaults at startup (printing what an AMX host
    # prints) unless --no-repack is given, in which case it runs the real server.
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    standin = tmp_path / "llama-server-amx"
    standin.write_text(f"""#!/usr/bin/env bash
for a in "$@"; do [ "$a" = "--no-repack" ] && exec "{server_binary}" "$@"; done
echo "system_info: n_threads = 2 | CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
echo "load_tensors: AMX model buffer size = 1.25 MiB"
echo "#3  0x00007f1c2a ggml_backend_amx_mul_mat"
kill -SEGV $$
""")
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)
    text = (
        (drill.out_dir / "stack.toml")
        .read_text()
        .replace("[server]\n", f'[server]\nbinary = "{standin}"\n')
    )
    stack_path = drill.out_dir / "stack-amx.toml"
    stack_path.write_text(text)
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    diagnosis = diagnose(
        store,
        Intake(drill.request("greedy")),
        load_stack(stack_path),
        options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
    ).to_json()
    store.close()
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    assert causes["cpu-backend"]["status"] == "confirmed"
    no_repack = arms["no-repack"]
    assert no_repack["failures"] == 0 and no_repack["n"] >= 4
    assert f"0/{no_repack['n']}" in causes["cpu-backend"]["rationale"]
    assert arms["baseline"]["failures"] == arms["baseline"]["n"] >= 4
    assert [c for c in causes.values() if c["status"] == "confirmed"] == [causes["cpu-backend"]]
    crash = {o["name"]: o for o in diagnosis["observations"]}["startup-crash"]
    assert crash["signal"] == "SIGSEGV"
    assert crash["backtrace_symbol"] == "ggml_backend_amx_mul_mat"
    assert crash["repack"] is True and "AMX_INT8" in crash["cpu_flags"]
    assert diagnosis["state"] == "done"
    _no_leaked_servers()


def test_cli_diagnoses_from_the_request_alone_and_show_prints_it(
    server_binary: Path, tmp_path: Path
) -> None:
    import json
    import os
    import subprocess
    import sys

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    request_path = tmp_path / "request.json"
    request_path.write_text(json.dumps(drill.request("greedy")))
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    out = tmp_path / "diagnosis.json"
    cli = [sys.executable, "-m", "triage.cli"]
    done = subprocess.run(
        [
            *cli,
            "diagnose",
            "--request",
            str(request_path),
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
        timeout=800,
    )
    assert done.returncode == 0, done.stderr
    diagnosis = json.loads(out.read_text())
    # No exchange: no exchange findings, only the model-file lint's (passed on the drill).
    assert diagnosis["exchange_evidence"] is None
    assert {f["kind"] for f in diagnosis["findings"]} <= set(LINT_KINDS)
    assert diagnosis["reproduction"]["reproduced"] is True
    assert {c["id"]: c for c in diagnosis["causes"]}["reasoning-exhausts-budget"][
        "status"
    ] == "confirmed"
    shown = subprocess.run(
        [*cli, "show", diagnosis["incident"], "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run_id"] == diagnosis["run_id"]
    typo = subprocess.run(
        [
            *cli,
            "diagnose",
            "--request",
            str(request_path),
            "--stack",
            str(drill.out_dir / "stack.toml"),
            "--incident",
            "2026-01-01-typo",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert typo.returncode != 0 and "no such incident" in typo.stderr
    _no_leaked_servers()
