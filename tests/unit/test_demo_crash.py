"""`triage demo` turns a crashed drill server into a message (the real path runs in
tests/integration/test_llama_crash_real.py)."""

from __future__ import annotations

from pathlib import Path

import click

from triage.demo import DemoError, crash_message, crash_report_of
from triage.drills.standin import AMX_CRASH_LOG
from triage.llama.crash import crash_report
from triage.llama.launcher import ServerStartError


class WrappedError(Exception):
    pass


def test_report_is_found_through_the_cause_chain():
    report = crash_report("startup", exit_code=-11, log_text=AMX_CRASH_LOG)
    try:
        try:
            raise ServerStartError("exited with code -11", report=report)
        except ServerStartError as inner:
            raise WrappedError("the incident's server did not start") from inner
    except WrappedError as outer:
        assert crash_report_of(outer) is report
    assert crash_report_of(ValueError("no server involved")) is None


def test_message_names_crash_log_and_what_to_do_on_an_amx_cpu():
    report = crash_report(
        "startup", exit_code=-11, log_text=AMX_CRASH_LOG, host_flags={"avx2"}, log_path="/tmp/x.log"
    )
    message = crash_message(report, Path("/d/stack.toml"))
    assert message.startswith(
        "the demo's llama-server failed: llama-server crashed with "
        "SIGSEGV during startup (warm-up) in ggml_backend_amx_mul_mat"
    )
    assert "server log:  /tmp/x.log" in message and "drill stack: /d/stack.toml" in message
    assert "TRIAGE_CPU_FLAGS=amx_int8" in message
    assert message.count("\n    ") == 10  # the last ten log lines
    assert issubclass(DemoError, click.ClickException)


def test_message_without_amx_suspicion_has_no_amx_hint():
    report = crash_report("hang", log_text="main: loading model\n", detail="no /health in 1s")
    assert "TRIAGE_CPU_FLAGS" not in crash_message(report, Path("s.toml"))
