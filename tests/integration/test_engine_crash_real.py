"""The engine on a real llama-server behind the AMX crash stand-in (issue 12): the startup
crash is diagnosed from the launcher's CrashReport (signal, backtrace symbol, AMX facts,
the report's sentence), cpu-backend is confirmed by the no-repack arm's k/n, and a drill
stack's host workaround is named in the printed diagnosis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Diagnosis
from kb.repo.store import Store
from triage.commands.engine import format_diagnosis
from triage.drills import build_drill
from triage.drills.standin import write_amx_crash_standin
from triage.engine import DiagnoseOptions, Intake, diagnose
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
    stack_path.write_text(
        f"# {NOTE} -- added for this drill, not part of the incident\n"
        + body.replace("[server]\n", f'[server]\nbinary = "{standin}"\n')
        + "\n"
    )
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("greedy")),
            load_stack(stack_path),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
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
    printed = format_diagnosis(Diagnosis.from_json(diagnosis)).splitlines()
    assert printed[1] == f"note: {NOTE} (drill servers only)"
    assert "cpu-backend" in "\n".join(printed)


_MID_REQUEST = '''\
#!{python}
"""Stand-in: answers /health like llama-server, then dies of SIGSEGV (printing the AMX
crash lines) on the first completion request -- unless --no-repack: then the real one."""
import http.server, os, resource, signal, sys
REAL = {real!r}
LOG = {log!r}
args = sys.argv[1:]
if {{"--no-repack", "-nr", "--version", "--help", "-h"}} & set(args):
    os.execv(REAL, [REAL, *args])
head, _, trace = LOG.partition("/opt/llama")
sys.stderr.write(head.replace("{{model}}", "m"))
sys.stderr.write("0.00.200.000 I srv  update_slots: all slots are idle\\n")
sys.stderr.flush()
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        ok = self.path.startswith("/health")
        body = b'{{"status": "ok"}}' if ok else b'{{"error": "not found"}}'
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        sys.stderr.write("/opt/llama" + trace)
        sys.stderr.flush()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)

http.server.HTTPServer((host, port), Handler).serve_forever()
'''


def _mid_request_stack(server_binary: Path, tmp_path: Path) -> tuple[Any, Path]:
    import stat
    import sys

    from triage.drills.standin import AMX_CRASH_LOG

    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    standin = tmp_path / "llama-server-mid"
    standin.write_text(
        _MID_REQUEST.format(python=sys.executable, real=str(server_binary), log=AMX_CRASH_LOG)
    )
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)
    text = (drill.out_dir / "stack.toml").read_text()
    stack_path = drill.out_dir / "stack-mid.toml"
    stack_path.write_text(text.replace("[server]\n", f'[server]\nbinary = "{standin}"\n'))
    return drill, stack_path


def _diagnose(
    tmp_path: Path, stack_path: Path, request: dict[str, Any], **kwargs: Any
) -> dict[str, Any]:
    from triage.llama.launcher import running_servers

    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        return diagnose(
            store,
            Intake(request, **kwargs),
            load_stack(stack_path),
            options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
        ).to_json()
    finally:
        store.close()
        assert running_servers() == []


def test_a_crash_mid_request_is_probed_like_any_failure(
    server_binary: Path, tmp_path: Path
) -> None:
    drill, stack_path = _mid_request_stack(server_binary, tmp_path)
    diagnosis = _diagnose(tmp_path, stack_path, drill.request("greedy"))
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    # Not an engine error: the crash is the failure, reproduced, and decided by an arm.
    assert diagnosis["reproduction"]["reproduced"] is True
    assert arms["baseline"]["failures"] == arms["baseline"]["n"] >= 4
    assert arms["no-repack"]["failures"] == 0 and arms["no-repack"]["n"] >= 4
    assert causes["cpu-backend"]["status"] == "confirmed"
    assert [c for c in causes.values() if c["status"] == "confirmed"] == [causes["cpu-backend"]]
    crash = {o["name"]: o for o in diagnosis["observations"]}["mid-request-crash"]
    assert crash["phase"] == "mid-request" and crash["signal"] == "SIGSEGV"
    assert crash["backtrace_symbol"] == "ggml_backend_amx_mul_mat"
    assert "in the middle of a request" in crash["sentence"]
    # The crash is on the request, not in the warm-up: --no-warmup does not remove it.
    assert arms["no-warmup"]["failures"] == arms["no-warmup"]["n"] >= 4
    assert causes["warmup-decode"]["status"] == "rejected"


def test_a_captured_502_is_reproduced_by_a_server_that_crashes_mid_request(
    server_binary: Path, tmp_path: Path
) -> None:
    # The capture is what the client saw behind a proxy: a 502 page. The replays crash the
    # server, which is that failure: reproduced, and the no-repack arm decides cpu-backend.
    from triage.capture import exchange_from_http
    from triage.symptoms import classify

    drill, stack_path = _mid_request_stack(server_binary, tmp_path)
    request = drill.request("greedy")
    exchange = exchange_from_http(request, b"<html><body>502 Bad Gateway</body></html>", status=502)
    findings = tuple(f.record() for f in classify(exchange))
    diagnosis = _diagnose(
        tmp_path, stack_path, request, exchange=exchange.to_dict(), findings=findings
    )
    assert diagnosis["reproduction"]["reproduced"] is True
    # The page is a gateway's (issue 24: a gateway failure, not by itself a crash); a replay
    # whose server crashes direct reproduces it.
    assert "gateway-error" in diagnosis["reproduction"]["signature"]["kinds"]
    assert "server-crash" not in diagnosis["reproduction"]["signature"]["kinds"]
    causes = {c["id"]: c for c in diagnosis["causes"]}
    assert causes["cpu-backend"]["status"] == "confirmed"
    assert diagnosis["state"] == "done"


def test_a_server_that_hangs_on_requests_is_diagnosed_as_a_hang(
    server_binary: Path, tmp_path: Path
) -> None:
    # The stand-in answers /health, then never answers a completion unless --no-repack.
    drill, stack_path = _mid_request_stack(server_binary, tmp_path)
    standin = tmp_path / "llama-server-mid"
    standin.write_text(
        standin.read_text().replace(
            "    def do_POST(self):\n",
            "    def do_POST(self):\n"
            "        if 'completions' not in self.path:\n"
            "            self.send_response(404)\n"
            "            self.send_header('Content-Length', '0')\n"
            "            self.end_headers()\n"
            "            return\n"
            "        import time\n"
            "        time.sleep(3600)\n",
        )
    )
    from triage.llama.launcher import running_servers

    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        diagnosis = diagnose(
            store,
            Intake(drill.request("greedy")),
            load_stack(stack_path),
            options=DiagnoseOptions(
                max_requests=4, request_timeout=3, stall_seconds=10, log_dir=tmp_path / "runs"
            ),
        ).to_json()
    finally:
        store.close()
    assert running_servers() == []
    arms = {a["name"]: a for a in diagnosis["arms"]}
    causes = {c["id"]: c for c in diagnosis["causes"]}
    hang = {o["name"]: o for o in diagnosis["observations"]}["server-hang"]
    assert hang["phase"] == "hang" and hang["kind"] == "server-hang"
    assert "hung" in hang["sentence"]
    assert arms["baseline"]["failures"] == arms["baseline"]["n"] == 4
    assert arms["no-repack"]["failures"] == 0 and arms["no-repack"]["n"] == 4
    # 4/4 hangs vs 0/4 with --no-repack (one-sided Fisher p = 1/70): cpu-backend, alone.
    assert causes["cpu-backend"]["status"] == "confirmed"
    assert "0/4" in causes["cpu-backend"]["rationale"]
    assert [c for c in causes.values() if c["status"] == "confirmed"] == [causes["cpu-backend"]]
