"""A server that crashes (at startup or mid-request) or hangs is a symptom, not an error.

The launcher's errors carry a `CrashReport` (`.report`, triage/llama/crash.py): phase,
signal, log tail, backtrace symbol, CPU feature flags and REPACK / AMX lines from the
server's own output. This module turns one into the engine's crash facts (an observation,
a failing reply's kinds). The message is parsed only for an error without a report (an
older launcher or a test double).
"""

from __future__ import annotations

import re
import signal
from dataclasses import replace
from typing import Any

__all__ = [
    "CRASH_KIND",
    "HANG_KIND",
    "crash_facts",
    "crash_kind",
    "crash_reply",
    "report_of",
    "startup_crash",
]

CRASH_KIND = "server-crash"
HANG_KIND = "server-hang"
_EXIT = re.compile(r"exited with code (-?\d+) during startup")
_SYMBOL = re.compile(r"\b(ggml_[A-Za-z0-9_]+|llama_[A-Za-z0-9_]+)\b")
_FLAG = re.compile(r"\b([A-Z][A-Z0-9_]+) = 1\b")
_OBSERVATION = {
    "startup": "startup-crash",
    "mid-request": "mid-request-crash",
    "hang": "server-hang",
}


def report_of(exc: BaseException | None) -> Any | None:
    """The CrashReport an exception carries (launcher errors, ServerCrashed/ServerHung)."""
    report = getattr(exc, "report", None) if exc is not None else None
    return report if report is not None and hasattr(report, "to_dict") else None


def crash_kind(report: Any) -> str:
    """The finding kind of a report: `server-hang` for a hang, else `server-crash`."""
    return HANG_KIND if getattr(report, "phase", "") == "hang" else CRASH_KIND


def _is_crash(report: Any) -> bool:
    """A hang, or a death by a signal (or a shell's 128+SIGABRT/SIGSEGV): not a bad flag."""
    if report.phase == "hang":
        return True
    code = report.exit_code
    return report.signal is not None or code in (134, 139)


def crash_facts(report: Any) -> dict[str, Any]:
    """The observation of a crash or hang: the report's facts, its sentence and the keys
    the cpu-backend cause reads (signal, backtrace_symbol, cpu_flags, repack, amx_lines)."""
    facts = dict(report.to_dict())
    tail = "\n".join(report.log_tail)
    symbol = report.backtrace_symbol
    if symbol is None:  # a frame without "(...)" (plain `#3 0x... sym`): any ggml/llama name
        symbols = _SYMBOL.findall(tail)
        symbol = symbols[-1] if symbols else None
    flags = sorted(k for k, v in report.cpu_features.items() if v == "1") or sorted(
        set(_FLAG.findall(next((line for line in report.log_tail if "system_info" in line), "")))
    )
    code = report.exit_code
    name = report.signal or (f"exit code {code}" if code is not None else "no exit")
    amx = [line for line in report.buffers if "AMX" in line]
    amx += [line.strip()[:200] for line in report.log_tail if "AMX" in line and line not in amx]
    what = {
        "startup": "crashes at startup",
        "mid-request": "crashes in the middle of a request",
        "hang": "hangs",
    }.get(report.phase, "fails")
    summary = f"the incident's server {what}" + (
        "" if report.phase == "hang" else f" ({name}, exit code {code})"
    )
    facts.update(
        {
            "name": _OBSERVATION.get(report.phase, "server-crash"),
            "kind": crash_kind(report),
            "signal": report.signal or (name if report.phase != "hang" else None),
            "backtrace_symbol": symbol,
            "cpu_flags": flags,
            "repack": bool(report.repack) or "REPACK = 1" in tail,
            "amx_lines": amx[:5],
            "log_tail": tail[-2000:],
            "summary": summary + (f" in {symbol}" if symbol else ""),
            "sentence": report.sentence(),
        }
    )
    return facts


def startup_crash(error: BaseException | str) -> dict[str, Any] | None:
    """The crash facts when a launch failed because the server died of a signal (or
    aborted) before /health; None when it failed otherwise (bad flag, no /health in time:
    not a startup crash). Reads the error's CrashReport; a bare message is parsed."""
    report = report_of(error) if isinstance(error, BaseException) else None
    if report is not None:
        if report.phase != "startup" or not _is_crash(report):
            return None
        return crash_facts(report)
    return _from_message(str(error))


def _from_message(message: str) -> dict[str, Any] | None:
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
    summary = f"the incident's server crashes at startup ({name}, exit code {code})" + (
        f" in {symbols[-1]}" if symbols else ""
    )
    return {
        "name": "startup-crash",
        "kind": CRASH_KIND,
        "phase": "startup",
        "exit_code": code,
        "signal": name,
        "backtrace_symbol": symbols[-1] if symbols else None,
        "cpu_flags": sorted(set(_FLAG.findall(system_info))),
        "repack": "REPACK = 1" in tail,
        "amx_lines": [line.strip()[:200] for line in lines if "AMX" in line][:5],
        "log_tail": "\n".join(lines[-12:])[-2000:],
        "summary": summary,
        "sentence": summary + ".",
    }


def crash_reply(reply: Any, report: Any) -> Any:
    """A replay whose server crashed mid-request or hung: a failing reply of kind
    `server-crash` / `server-hang` (with the signal), not an errored one -- the failure is
    a measurement the reproduction gate and the cause rules read like any other."""
    kinds = [crash_kind(report)] + ([report.signal] if report.signal else [])
    if kinds[0] == HANG_KIND:
        kinds.append("timeout")  # what a client saw of a hang: a capture that timed out
    return replace(reply, failed=True, kinds=kinds, error="", text="")
