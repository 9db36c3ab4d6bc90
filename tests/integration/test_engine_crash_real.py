"""The engine on a real llama-server behind the AMX crash stand-in (issue 12): the startup
crash is diagnosed from the launcher's CrashReport (signal, backtrace symbol, AMX facts,
the report's sentence), cpu-backend is confirmed by the no-repack arm's k/n, and a drill
stack's host workaround is named in the printed diagnosis."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.store import Store
from triage.commands.engine import format_diagnosis
from triage.drills import build_drill
from triage.drills.standin import write_amx_crash_standin
from triage.engine import DiagnoseOptions, diagnose
from triage.stackfile import load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NOTE = "host workaround: --no-repack (AMX host, llama.cpp#20824)"


def test_the_amx_standin_crash_is_diagnosed_from_its_crash_report(
    server_binary: Path, tmp_path: Path
) -> None:
    from triage.llama.launcher import running_servers

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    standin = write_amx_crash_standin(server_binary, tmp_path / "llama-server-amx")
    text = (drill.out_dir / "stack.toml").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("# host"))
    stack_path = drill.out_dir / "stack-amx.toml"
    stack_path.write_text(f"# {NOTE} -- added for this drill, not part of the incident\n"
                          + body.replace("[server]\n", f'[server]\nbinary = "{standin}"\n')
                          + "\n")
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(store, load_stack(stack_path), drill.request("greedy"),
                             options=DiagnoseOptions(max_requests=8,
                                                     log_dir=tmp_path / "runs"))
    finally:
        store.close()
    assert running_servers() == []
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    assert causes["cpu-backend"]["status"] == "confirmed"
    assert [c for c in causes.values() if c["status"] == "confirmed"] == [causes["cpu-backend"]]
    no_repack = arms["no-repack"]
    assert no_repack["failures"] == 0 and no_repack["n"] >= 4
    assert f"0/{no_repack['n']}" in causes["cpu-backend"]["rationale"]
    crash = {o["name"]: o for o in diagnosis["observations"]}["startup-crash"]
    # From the report (the glibc frame is demangled there), not from the message.
    assert crash["signal"] == "SIGSEGV" and crash["phase"] == "startup"
    assert crash["backtrace_symbol"] == "ggml_backend_amx_mul_mat"
    assert crash["amx_build"] is True and crash["repack"] is True
    assert "llama.cpp#20824" in crash["sentence"]
    assert diagnosis["stack"]["host_workaround"] == NOTE
    printed = format_diagnosis(diagnosis).splitlines()
    assert printed[1] == f"note: {NOTE} (drill servers only)"
    assert "cpu-backend" in "\n".join(printed)
