"""A server that crashes at startup is a symptom, not an error: read what the launcher's
exception says (exit code, log tail) into a `startup-crash` observation -- signal name,
the backtrace symbol when the log has one, CPU feature flags and REPACK / AMX lines from
the server's own `system_info` output."""

from __future__ import annotations

import re
import signal
from typing import Any

__all__ = ["CRASH_KIND", "startup_crash"]

CRASH_KIND = "server-crash"
_EXIT = re.compile(r"exited with code (-?\d+) during startup")
_SYMBOL = re.compile(r"\b(ggml_[A-Za-z0-9_]+|llama_[A-Za-z0-9_]+)\b")
_FLAG = re.compile(r"\b([A-Z][A-Z0-9_]+) = 1\b")


def startup_crash(message: str) -> dict[str, Any] | None:
    """The crash facts when a launch failed because the server died of a signal (or
    aborted); None when it failed otherwise (bad flag, timeout: not a crash)."""
    match = _EXIT.search(message)
    if match is None:
        return None
    code = int(match.group(1))
    if code >= 0 and code not in (134, 139):  # 128+SIGABRT / 128+SIGSEGV from a shell
        return None
    number = -code if code < 0 else code - 128
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    tail = message.split(":\n", 1)[1] if ":\n" in message else ""
    lines = [line for line in tail.splitlines() if line.strip()]
    system_info = next((line for line in lines if "system_info" in line or "CPU :" in line), "")
    symbols = _SYMBOL.findall(tail)
    return {
        "name": "startup-crash",
        "exit_code": code,
        "signal": name,
        "backtrace_symbol": symbols[-1] if symbols else None,
        "cpu_flags": sorted(set(_FLAG.findall(system_info))),
        "repack": "REPACK = 1" in tail,
        "amx_lines": [line.strip()[:200] for line in lines if "AMX" in line][:5],
        "log_tail": "\n".join(lines[-12:])[-2000:],
        "summary": f"the incident's server crashes at startup ({name}, exit code {code})"
        + (f" in {symbols[-1]}" if symbols else ""),
    }
