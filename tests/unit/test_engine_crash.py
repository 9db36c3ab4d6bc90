"""The engine reads the launcher's CrashReport (issue 12): startup crashes, crashes
mid-request and hangs are findings, not engine errors; drill stacks name their host
workaround in the diagnosis. Fakes only: no server is started here."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Diagnosis, Finding
from kb.domain.records import Reply
from triage.capture import exchange_from_http
from triage.drills.standin import AMX_CRASH_LOG
from triage.engine.crashes import (
    CRASH_KIND,
    HANG_KIND,
    crash_facts,
    startup_crash,
)
from triage.engine.replayer import crashed_replies
from triage.engine.reproduction import Signature
from triage.engine.scheduler import ArmFailed
from triage.engine.servers import Server
from triage.llama.crash import crash_report
from triage.stackfile import parse_stack
from triage.symptoms import classify

REQUEST = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


class _Failed(Exception):
    def __init__(self, message: str, report: Any) -> None:
        super().__init__(message)
        self.report = report
        self.log_tail = "\n".join(report.log_tail) if report is not None else ""


def _amx_report(phase: str = "startup", code: int | None = -11, detail: str = "") -> Any:
    return crash_report(
        phase,
        exit_code=code,
        log_text=AMX_CRASH_LOG.replace("{model}", "m"),
        host_flags={"amx_int8", "amx_tile", "avx512f"},
        detail=detail,
    )


def test_startup_crash_reads_the_report_not_the_message() -> None:
    # The message says nothing parseable: everything comes from the report.
    facts = startup_crash(_Failed("llama-server did not become healthy", _amx_report()))
    assert facts is not None
    assert facts["name"] == "startup-crash" and facts["kind"] == CRASH_KIND
    assert facts["signal"] == "SIGSEGV" and facts["exit_code"] == -11
    assert facts["backtrace_symbol"] == "ggml_backend_amx_mul_mat"
    assert facts["repack"] is True and "AMX_INT8" in facts["cpu_flags"]
    assert any("AMX model buffer size" in line for line in facts["amx_lines"])
    assert "llama.cpp#20824" in facts["sentence"] and "--no-repack" in facts["sentence"]
    assert "in ggml_backend_amx_mul_mat" in facts["summary"]
    assert facts["amx_suspected"] is True and facts["host_amx"] is True


def test_a_failed_launch_that_is_not_a_crash_is_not_diagnosed_as_one() -> None:
    bad_flag = crash_report("startup", exit_code=1, log_text="error: invalid argument: --bogus\n")
    assert startup_crash(_Failed("exited with code 1 during startup", bad_flag)) is None
    no_health = crash_report(
        "hang", exit_code=None, log_text="loading...\n", detail="no /health within 60s"
    )
    assert startup_crash(_Failed("no /health", no_health)) is None
    # Refused before start: no report, and the message has no exit code.
    assert startup_crash(_Failed("binary not found", None)) is None


def test_an_error_without_a_report_still_parses_the_launchers_message() -> None:
    facts = startup_crash(
        RuntimeError("llama-server exited with code -6 during startup:\nabort in ggml_abort\n")
    )
    assert facts is not None and facts["signal"] == "SIGABRT"
    assert facts["backtrace_symbol"] == "ggml_abort"


def test_a_hang_is_its_own_finding_kind() -> None:
    facts = crash_facts(
        crash_report(
            "hang",
            exit_code=None,
            log_text="slot launch\n",
            detail="a request got no complete answer",
        )
    )
    assert facts["kind"] == HANG_KIND and facts["name"] == "server-hang"
    assert facts["signal"] is None and "hung" in facts["sentence"]


class _Handle:
    """A RunningServer double: explain() answers like the launcher's."""

    def __init__(self, report: Any, *, dead: bool = True) -> None:
        self.report, self.dead, self.asked = report, dead, []

    def alive(self) -> bool:
        return not self.dead

    def explain(self, error: BaseException) -> Any:
        self.asked.append(error)
        self.dead = self.dead or self.report is not None  # it died (or was stopped, hung)
        return None if self.report is None else _Failed("crashed", self.report)

    def crash_report(self) -> Any:
        return self.report

    def log_tail(self, lines: int = 40) -> str:
        return "tail"


def _server(handle: Any) -> Server:
    stack = parse_stack('[server]\nurl = "http://127.0.0.1:1"\n', base=Path("."))
    return Server("k", stack.server, "http://127.0.0.1:1", 1, 0.0, handle)


def _reply(index: int, error: str = "", kinds: tuple[str, ...] = ()) -> Reply:
    return Reply(
        "baseline",
        index,
        1000 + index,
        bool(error),
        list(kinds) or (["http-error"] if error else []),
        "stop" if not error else None,
        5,
        0,
        None if error else 200,
        0.1,
        {},
        error=error,
    )


def test_replies_of_a_server_that_crashed_mid_request_are_failing_crash_replies() -> None:
    report = _amx_report("mid-request")
    handle = _Handle(report)
    server = _server(handle)
    replies = crashed_replies(server, [_reply(0), _reply(1, "connection reset")])
    assert not replies[0].failed and replies[0].kinds == []
    crashed = replies[1]
    assert crashed.failed and not crashed.error
    assert crashed.kinds == [CRASH_KIND, "SIGSEGV"]
    assert server.failure is report
    assert "SIGSEGV" in server.death_message()


def test_a_timed_out_replay_of_a_live_server_is_a_hang() -> None:
    report = crash_report("hang", exit_code=None, log_text="", detail="no answer")
    handle = _Handle(report, dead=False)
    replies = crashed_replies(_server(handle), [_reply(0, "timed out", ("timeout",))])
    assert isinstance(handle.asked[0], TimeoutError)
    assert replies[0].kinds == [HANG_KIND, "timeout"]
    assert replies[0].failed and not replies[0].error
    # A capture that timed out on the client is reproduced by a hang, not by a crash.
    captured = Signature(frozenset({"timeout"}))
    assert captured.matches(replies[0])
    crash = crashed_replies(
        _server(_Handle(_amx_report("mid-request"))), [_reply(0, "connection reset")]
    )[0]
    assert not captured.matches(crash)


def test_an_error_the_server_does_not_explain_stays_an_error() -> None:
    alive = _server(_Handle(None, dead=False))
    replies = crashed_replies(alive, [_reply(0, "HTTP 500 hiccup")])
    assert replies[0].error == "HTTP 500 hiccup"
    dead = _server(_Handle(None, dead=True))
    with pytest.raises(ArmFailed):
        crashed_replies(dead, [_reply(0, "connection refused")])


def test_an_external_url_server_never_explains() -> None:
    server = _server(None)
    replies = crashed_replies(server, [_reply(0, "connection refused")])
    assert replies[0].error == "connection refused" and server.failure is None


def _findings(exchange: Any) -> list[Finding]:
    return [f.record() for f in classify(exchange)]


def test_a_captured_proxy_502_page_is_a_gateway_error_that_a_crash_replay_reproduces() -> None:
    exchange = exchange_from_http(REQUEST, "<html><h1>502 Bad Gateway</h1></html>", status=502)
    findings = _findings(exchange)
    failed = {f.kind for f in findings if not f.passed}
    # The page is the gateway's: a gateway failure, not by itself a server crash (issue 24)...
    assert "gateway-error" in failed and not failed & {"server-crash", "server-hang"}
    # ... while a bare 502 with no page still reads as the upstream failing.
    bare = _findings(exchange_from_http(REQUEST, b"", status=502))
    assert "server-crash" in {f.kind for f in bare if not f.passed}
    signature = Signature.from_findings(findings, {"status": 502})
    report = _amx_report("mid-request")
    crash = crashed_replies(_server(_Handle(report)), [_reply(0, "connection reset")])[0]
    assert signature.matches(crash)
    length_stop = Reply("baseline", 1, 1001, True, ["length-stop"], "length", 0, 90, 200, 0.1, {})
    assert not signature.matches(length_stop)  # issue 12 defect 3 stays refused
    # A server's own HTTP 500 (not a crash) is not reproduced by a crash either.
    plain = exchange_from_http(
        REQUEST, {"error": {"code": 500, "message": "Failed to parse input at pos 3"}}, status=500
    )
    plain_findings = _findings(plain)
    assert "server-crash" not in {f.kind for f in plain_findings if not f.passed}
    assert not Signature.from_findings(plain_findings, {"status": 500}).matches(crash)


def test_a_captured_504_is_a_hang_and_a_normal_reply_is_neither() -> None:
    hung = {
        f.kind
        for f in _findings(
            exchange_from_http(REQUEST, b"", status=504)  # no page: nobody named
        )
        if not f.passed
    }
    assert "server-hang" in hung and "server-crash" not in hung
    ok = exchange_from_http(
        REQUEST,
        {
            "choices": [
                {"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
            ]
        },
        status=200,
    )
    assert not {f.kind for f in _findings(ok) if not f.passed} & {
        "server-crash",
        "server-hang",
    }


def test_crash_and_hang_kinds_have_reserved_numbers() -> None:
    from triage.catalogue import catalogue

    numbers = catalogue().checks.numbers()
    assert numbers["server-crash"] == 11 and numbers["server-hang"] == 12


def test_the_printed_diagnosis_names_a_drill_stacks_host_workaround(tmp_path: Path) -> None:
    from triage.commands.engine import format_diagnosis
    from triage.engine.decide import host_workaround as _host_workaround
    from triage.stackfile import load_stack

    note = "host workaround: --no-repack (AMX host, llama.cpp#20824)"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    path = tmp_path / "stack.toml"
    path.write_text(
        f"# Drill x\n# {note} -- added for this drill, not part of the incident\n"
        '[server]\nmodel = "m.gguf"\nargs = ["--no-repack"]\n'
    )
    stack = load_stack(path, build_missing=False)
    assert _host_workaround(stack) == note
    diagnosis = {"incident": "i", "run_id": 1, "stack": {"host_workaround": note}}
    lines = format_diagnosis(Diagnosis.from_json(diagnosis)).splitlines()
    assert lines[1] == f"note: {note} (drill servers only)"
    # A user's own stack carries no note, and the diagnosis prints none.
    path.write_text('[server]\nmodel = "m.gguf"\n')
    assert _host_workaround(load_stack(path, build_missing=False)) is None
    assert "note:" not in format_diagnosis(
        Diagnosis.from_json({"incident": "i", "run_id": 1, "stack": {"host_workaround": None}})
    )


def test_crashed_replies_work_inside_a_running_loop() -> None:
    # LlamaReplayer calls it from inside its coroutine: it must not need a loop itself.
    async def inside() -> list[Reply]:
        return crashed_replies(_server(_Handle(_amx_report("mid-request"))), [_reply(0, "reset")])

    assert asyncio.run(inside())[0].kinds[0] == CRASH_KIND


class _DroppingClient:
    """A LlamaClient double whose server drops every completion."""

    def __init__(self, url: str, timeout: float = 0.0, api_key: str | None = None) -> None:
        self.url = url

    async def chat(self, body: Any) -> Any:
        from triage.llama.client import LlamaClientError

        raise LlamaClientError("server disconnected", kind="disconnected", url=self.url)

    async def aclose(self) -> None:
        return None


def _replayer(server: Server, arm: str) -> Any:
    from triage.engine.replayer import ArmRoute, LlamaReplayer

    replayer = LlamaReplayer(REQUEST, 1000, 5.0, 1)
    replayer.routes[arm] = ArmRoute(server, lambda body: body)
    return replayer


def test_the_baseline_measures_a_crash_but_another_arm_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import triage.llama.client as client_mod

    monkeypatch.setattr(client_mod, "LlamaClient", _DroppingClient)
    report = _amx_report("mid-request")
    # The baseline's replies are the crash: failing, of kind server-crash.
    baseline = asyncio.run(
        _replayer(_server(_Handle(report, dead=False)), "baseline").replay("baseline", [0, 1])
    )
    assert [r.kinds[0] for r in baseline] == [CRASH_KIND, CRASH_KIND]
    assert all(r.failed and not r.error for r in baseline)
    # A variant's server crashing is not that arm's measurement: it errors, with the report.
    with pytest.raises(ArmFailed, match="SIGSEGV"):
        asyncio.run(
            _replayer(_server(_Handle(report, dead=False)), "spec-off").replay("spec-off", [0])
        )
