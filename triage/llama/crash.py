"""What a dead or hung llama-server tells us: a typed `CrashReport` from its exit status and log.

Pure: everything here takes plain values (an exit status, the log text, a set of CPU flags).
The one exception is `host_cpu_flags`, which reads /proc/cpuinfo (or the `TRIAGE_CPU_FLAGS`
override, so that both sides of the AMX branch are testable on any host).

What llama-server prints that matters (build 11434):

* at `-lv 4` (trace), once at startup (after a "0.00.009.085 I cmn  common_param: " prefix,
  as every line): ``system_info: n_threads = 1 (n_threads_batch = 1) / 2 |
  CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | ... | REPACK = 1 |`` -- the CPU features the binary
  was built for and uses, and whether weights are repacked for the CPU kernels;
* at info level, per weights buffer: ``load_tensors:   AMX model buffer size = 6.03 MiB`` (or
  ``CPU_REPACK``; measured here on an AVX-512 host without AMX: ``CPU_REPACK ... 0.17 MiB``)
  when weights were repacked into the AMX / CPU-repack layout;
* ``warming up the model with an empty run`` right before the warm-up decode, where the AMX
  repacked path of GCC 11/12 builds segfaults (llama.cpp#20824, ollama#17205);
* a backtrace only when something printed one (gdb, glibc `backtrace_symbols_fd`, ggml's own
  unwinder); a plain SIGSEGV prints none.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kb.jsontypes import JsonObject

PHASES = ("startup", "mid-request", "hang")
NO_REPACK_FLAG = "--no-repack"
AMX_ISSUE = "llama.cpp#20824"
AMX_WORKAROUND_NOTE = f"host workaround: {NO_REPACK_FLAG} (AMX host, {AMX_ISSUE})"
CPU_FLAGS_ENV = "TRIAGE_CPU_FLAGS"
CPUINFO_PATH = Path("/proc/cpuinfo")
AMX_HOST_FLAGS = frozenset({"amx_int8", "amx_tile", "amx_bf16"})
# Weight buffers in a layout repacked for CPU kernels ("CPU_Mapped" is the plain mmap).
REPACKED_BUFFERS = ("AMX ", "CPU_REPACK ")

# Bounds: a log is read as its head (system_info and buffer lines come early) and its tail.
LOG_HEAD_BYTES = 256 * 1024
LOG_TAIL_BYTES = 256 * 1024
TAIL_LINES = 25
MAX_LINE_CHARS = 400
MAX_FRAMES = 64
CPUINFO_MAX_BYTES = 4 * 1024 * 1024

_SYSTEM_INFO = re.compile(r"system_info:\s*(?P<rest>.*)")
_FEATURE = re.compile(r"\b(?P<name>[A-Z][A-Z0-9_]*)\s*=\s*(?P<value>[^\s|]+)")
_BUFFER = re.compile(r"(?P<name>[A-Za-z0-9_]+)\s+model buffer size\s*=\s*(?P<mib>[0-9.]+)\s*MiB")
# Backtrace frame forms: gdb ("#3  0x... in ggml_x (...)" / "#3  ggml_x (...) at f.c:1"),
# glibc backtrace_symbols_fd ("/lib/libggml-cpu.so(_Z24ggml_x...+0x1a4)[0x7f...]") and
# ggml's unwinder ("3: 0x7f... ggml_x").
_GDB_FRAME = re.compile(r"^\s*#\d+\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(?P<sym>[^\s(]+)\s*\(")
_GLIBC_FRAME = re.compile(r"\((?P<sym>[^()+\s]+)\+0x[0-9a-fA-F]+\)\s*\[0x[0-9a-fA-F]+\]")
_UNWIND_FRAME = re.compile(r"^\s*\d+:\s+0x[0-9a-fA-F]+\s+(?P<sym>\S+)\s*$")
_MANGLED_PLAIN = re.compile(r"^_Z(?P<len>\d+)")
# Error lines: the logger's level letter after the timestamp ("0.00.414.869 E llama_model_load:
# error loading model: ...") or the argument parser's "error: invalid argument: --bogus".
_ERROR_LINE = re.compile(
    r"^(?:\d+\.\d+\.\d+\.\d+ E (?P<logged>.+)|(?P<plain>error: .+))$", re.IGNORECASE
)
MAX_ERRORS = 5
# Frames that belong to the crash reporting itself, not to the crash.
_REPORTER_FRAMES = frozenset(
    {
        "ggml_print_backtrace",
        "ggml_print_backtrace_symbols",
        "ggml_abort",
        "ggml_uncaught_exception",
    }
)
# Where in its life the server was, by the last of these lines its log shows.
_STAGES = (
    ("loading model", "model load"),
    ("load_tensors:", "model load"),
    ("llama_context:", "context setup"),
    ("warming up the model", "warm-up"),
    ("listening on http", "serving"),
    ("all slots are idle", "serving"),
    ("launch_slot_with_task", "decoding a request"),
    ("processing task", "decoding a request"),
)


def signal_name(exit_code: int | None) -> str | None:
    """SIGSEGV for -11 (killed by a signal, as Popen reports it) or 139 (a shell's 128+11)."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _demangle(symbol: str) -> str:
    """The plain function name of a simple Itanium-mangled C++ symbol (_Z24ggml_...P...);
    anything else unchanged. (No c++filt dependency: the names we look for are plain.)"""
    match = _MANGLED_PLAIN.match(symbol)
    if match:
        start = match.end()
        return symbol[start : start + int(match.group("len"))]
    if symbol.startswith("_ZN"):
        parts, index = [], 3
        while index < len(symbol) and symbol[index].isdigit():
            digits = re.match(r"\d+", symbol[index:])
            assert digits is not None
            length = int(digits.group())
            index += len(digits.group())
            parts.append(symbol[index : index + length])
            index += length
        if parts:
            return "::".join(parts)
    return symbol


def backtrace_frames(lines: Iterable[str]) -> list[str]:
    """Function names of the backtrace frames in the log, innermost first."""
    frames: list[str] = []
    for line in lines:
        for pattern in (_GDB_FRAME, _GLIBC_FRAME, _UNWIND_FRAME):
            match = pattern.search(line)
            if match:
                frames.append(_demangle(match.group("sym")))
                break
        if len(frames) >= MAX_FRAMES:
            break
    return frames


def crash_symbol(frames: Iterable[str]) -> str | None:
    """The innermost ggml/llama frame that is not the crash reporter itself."""
    for frame in frames:
        lowered = frame.lower()
        if frame in _REPORTER_FRAMES or "backtrace" in lowered:
            continue
        if "ggml" in lowered or "llama" in lowered:
            return frame
    return None


def system_info_features(lines: Iterable[str]) -> dict[str, str]:
    """The feature table of llama-server's `system_info:` line ({} when it did not print one,
    e.g. below `-lv 4`)."""
    for line in lines:
        match = _SYSTEM_INFO.search(line)
        if match:
            # Skip "n_threads = 1 (n_threads_batch = 1) / 2": features follow the first "|".
            _, _, table = match.group("rest").partition("|")
            return {m.group("name"): m.group("value") for m in _FEATURE.finditer(table)}
    return {}


def buffer_lines(lines: Iterable[str]) -> list[str]:
    """The `<NAME> model buffer size = X MiB` lines of the model load, as printed."""
    found = []
    for line in lines:
        match = _BUFFER.search(line)
        if match:
            found.append(f"{match.group('name')} model buffer size = {match.group('mib')} MiB")
    return found


def error_lines(lines: Iterable[str]) -> list[str]:
    """The first error lines the server logged (level E, or "error: ..."), without prefixes."""
    found: list[str] = []
    for line in lines:
        match = _ERROR_LINE.match(line.strip())
        if match:
            text = _clip((match.group("logged") or match.group("plain")).strip())
            if text not in found:
                found.append(text)
            if len(found) >= MAX_ERRORS:
                break
    return found


def last_stage(lines: Iterable[str]) -> str | None:
    """What the server was doing by its log's last recognised line (e.g. "warm-up")."""
    stage = None
    for line in lines:
        for marker, name in _STAGES:
            if marker in line:
                stage = name
    return stage


def parse_cpu_flags(text: str) -> frozenset[str]:
    """Flags of the first `flags` (x86) or `Features` (arm) line of /proc/cpuinfo text."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def host_cpu_flags(
    cpuinfo: Path | None = None, env: Mapping[str, str] | None = None
) -> frozenset[str]:
    """This host's CPU flags: `$TRIAGE_CPU_FLAGS` (space or comma separated) when set, else
    /proc/cpuinfo (empty when unreadable, e.g. not Linux)."""
    environ = os.environ if env is None else env
    override = environ.get(CPU_FLAGS_ENV)
    if override is not None:
        return frozenset(override.replace(",", " ").split())
    try:
        with (cpuinfo or CPUINFO_PATH).open("rb") as handle:
            text = handle.read(CPUINFO_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return frozenset()
    return parse_cpu_flags(text)


def host_has_amx(flags: Iterable[str]) -> bool:
    """True when the CPU flags include AMX (amx_int8 / amx_tile / amx_bf16)."""
    return bool(AMX_HOST_FLAGS.intersection(flags))


def relevant_cpu_flags(flags: Iterable[str]) -> list[str]:
    """The flags that pick CPU kernels in ggml (AMX, AVX-512, AVX2, VNNI, FMA, F16C)."""
    return sorted(
        f
        for f in flags
        if f.startswith(("amx", "avx512", "avx_vnni")) or f in ("avx2", "fma", "f16c")
    )


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "..."


@dataclass(frozen=True)
class CrashReport:
    """How a llama-server died or hung, with the facts from its own output."""

    phase: str  # startup | mid-request | hang
    exit_code: int | None = None  # None: still running when we gave up (a hang)
    signal: str | None = None  # e.g. "SIGSEGV"
    log_tail: tuple[str, ...] = ()
    backtrace: tuple[str, ...] = ()  # frame function names, innermost first
    backtrace_symbol: str | None = None  # innermost ggml/llama frame
    cpu_features: dict[str, str] = field(default_factory=dict)  # from system_info
    buffers: tuple[str, ...] = ()  # "AMX model buffer size = 6.03 MiB", ...
    host_flags: frozenset[str] = frozenset()
    stage: str | None = None  # last recognised stage: model load, warm-up, serving, ...
    errors: tuple[str, ...] = ()  # the first error lines of the log (level E / "error:")
    detail: str = ""  # what the launcher/client saw (e.g. "no /health within 60s")
    log_path: str | None = None

    @property
    def amx_build(self) -> bool:
        """system_info says the binary uses AMX (AMX_INT8 = 1)."""
        return self.cpu_features.get("AMX_INT8") == "1"

    @property
    def repack(self) -> bool | None:
        """system_info's REPACK flag (None when the log has no system_info line)."""
        if not self.cpu_features:
            return None
        return self.cpu_features.get("REPACK") == "1"

    @property
    def amx_buffer(self) -> bool:
        """Weights were repacked into an AMX buffer ("AMX model buffer size")."""
        return any(line.startswith("AMX ") for line in self.buffers)

    @property
    def host_amx(self) -> bool:
        """The host CPU has AMX."""
        return host_has_amx(self.host_flags)

    @property
    def amx_suspected(self) -> bool:
        """The crash points at the AMX repacked-weight path: a signal, and an AMX frame or
        AMX weights in an AMX build."""
        if self.signal is None:
            return False
        symbol = (self.backtrace_symbol or "").lower()
        return "amx" in symbol or (self.amx_buffer and (self.amx_build or self.host_amx))

    def sentence(self) -> str:
        """One paragraph for the user naming what is known."""
        return _sentence(self)

    def to_dict(self) -> JsonObject:
        """JSON-ready form (for findings, observations and error payloads)."""
        return {
            "phase": self.phase,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stage": self.stage,
            "detail": self.detail,
            "errors": list(self.errors),
            "backtrace_symbol": self.backtrace_symbol,
            "backtrace": list(self.backtrace),
            "cpu_features": dict(self.cpu_features),
            "repack": self.repack,
            "amx_build": self.amx_build,
            "buffers": list(self.buffers),
            "host_cpu_flags": relevant_cpu_flags(self.host_flags),
            "host_amx": self.host_amx,
            "amx_suspected": self.amx_suspected,
            "log_tail": list(self.log_tail),
            "log_path": self.log_path,
            "sentence": self.sentence(),
        }


def _what_happened(report: CrashReport) -> str:
    stage = f" ({report.stage})" if report.stage else ""
    if report.phase == "hang":
        where = f"{report.detail}" if report.detail else "it stopped answering"
        return f"llama-server hung{stage}: {where}"
    if report.signal:
        how = f"crashed with {report.signal}"
    elif report.exit_code is not None:
        how = f"exited with code {report.exit_code}"
    else:
        how = "stopped"
    when = "during startup" if report.phase == "startup" else "in the middle of a request"
    text = f"llama-server {how} {when}{stage}"
    return f"{text}: {report.detail}" if report.detail else text


def _sentence(report: CrashReport) -> str:
    parts = [_what_happened(report)]
    if report.backtrace_symbol:
        parts.append(f"in {report.backtrace_symbol}")
    if report.errors:
        parts.append(f'(first error: "{report.errors[0]}")')
    facts = []
    if report.cpu_features:
        shown = [
            f"{name} = {report.cpu_features[name]}"
            for name in ("AMX_INT8", "AVX512", "REPACK")
            if name in report.cpu_features
        ]
        if "REPACK" not in report.cpu_features:
            shown.append("REPACK off")
        facts.append("its system_info reports " + ", ".join(shown))
    repacked = [line for line in report.buffers if line.startswith(REPACKED_BUFFERS)]
    if repacked:
        facts.append("weights repacked: " + "; ".join(repacked))
    flags = relevant_cpu_flags(report.host_flags)
    amx_flags = [f for f in flags if f.startswith("amx")]
    if amx_flags:
        facts.append("this host's CPU has " + ", ".join(amx_flags))
    elif report.host_flags:
        facts.append("this host's CPU has no AMX")
    text = " ".join(parts)
    if facts:
        text += "; " + "; ".join(facts)
    text += "."
    if report.amx_suspected:
        text += (
            f" This matches the AMX repacked-weight crash ({AMX_ISSUE}): start the server "
            f"with {NO_REPACK_FLAG} to avoid that path."
        )
    return text


def _lines(text: str) -> list[str]:
    return text.splitlines()


def crash_report(
    phase: str,
    *,
    exit_code: int | None = None,
    log_text: str = "",
    host_flags: Iterable[str] = (),
    detail: str = "",
    log_path: str | None = None,
) -> CrashReport:
    """A report from the exit status (None for a hang) and the log text (head and tail are
    enough: see `read_log`)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, not {phase!r}")
    lines = _lines(log_text)
    frames = backtrace_frames(lines)
    return CrashReport(
        phase=phase,
        exit_code=exit_code,
        signal=signal_name(exit_code),
        log_tail=tuple(_clip(line) for line in lines[-TAIL_LINES:]),
        backtrace=tuple(frames),
        backtrace_symbol=crash_symbol(frames),
        cpu_features=system_info_features(lines),
        buffers=tuple(buffer_lines(lines)),
        host_flags=frozenset(host_flags),
        stage=last_stage(lines),
        errors=tuple(error_lines(lines)),
        detail=detail,
        log_path=log_path,
    )


def read_log(path: Path) -> str:
    """A server log's head and tail (bounded), joined; '' when unreadable."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(0)
            if size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
                data = handle.read()
            else:
                head = handle.read(LOG_HEAD_BYTES)
                handle.seek(size - LOG_TAIL_BYTES)
                # Cut at line boundaries so no half line is parsed.
                head = head[: head.rfind(b"\n") + 1]
                tail = handle.read()
                tail = tail[tail.find(b"\n") + 1 :]
                data = head + tail
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")
