"""What a llama-server binary accepts, read from its own `--help`, and what it refused.

`binary_flags(binary)` runs `BINARY --help` once per binary (per path, size and mtime, for
the life of the process) and parses the flag column of its usage text; `unknown_flags(args,
flags)` names the args that binary does not know, with the closest spelling it does, so a
stack is refused before anything launches. `flag_error_line(text)` finds the line in a log
or an error body where llama-server refused its launch configuration: an invalid or unknown
argument at startup, or a request its flags cannot serve ("tools param requires --jinja
flag").
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "UnknownFlag",
    "binary_flags",
    "flag_error_line",
    "parse_help",
    "unknown_flags",
]

HELP_TIMEOUT_S = 20.0
HELP_MAX_BYTES = 1 << 20
# A usage text with fewer flags than this is not llama-server's (a stand-in script, a
# wrapper that ignores --help): nothing is checked against it.
MIN_FLAGS = 20
_FLAG = re.compile(r"(?<![\w<|.])--?[A-Za-z][\w.-]*")
_IS_FLAG = re.compile(r"^--?[A-Za-z]")
# Lines where llama-server refuses its launch configuration (startup log, error bodies).
_REFUSED = re.compile(
    r"error: invalid argument: \S+"
    r"|error while handling argument[^\n]{0,200}"
    r"|error while handling environment variable[^\n]{0,200}"
    r"|tools param requires --jinja flag"
    r"|this custom template is not supported, try using --jinja"
    r"|unknown argument: \S+",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class UnknownFlag:
    """An arg the binary's --help does not list, and its closest known spelling."""

    flag: str
    suggestion: str | None

    def text(self) -> str:
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{self.flag}{hint}"


def parse_help(text: str) -> frozenset[str]:
    """The flags a llama-server usage text lists: every `-x`/`--long` in the flag column
    (the segments before the description, separated from it by two or more spaces)."""
    flags: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-"):
            continue  # description continuation lines are indented
        for segment in re.split(r"\s{2,}", line.strip()):
            if not segment.startswith("-"):
                break
            flags.update(_FLAG.findall(segment))
    return frozenset(flags)


@functools.lru_cache(maxsize=16)
def _flags(path: str, size: int, mtime_ns: int) -> frozenset[str]:
    try:
        done = subprocess.run(
            [path, "--help"],
            capture_output=True,
            timeout=HELP_TIMEOUT_S,
            check=False,
            env={**os.environ, "LLAMA_LOG_COLORS": "off"},
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    text = (done.stdout[:HELP_MAX_BYTES] + b"\n" + done.stderr[:HELP_MAX_BYTES]).decode(
        "utf-8", errors="replace"
    )
    flags = parse_help(text)
    return flags if len(flags) >= MIN_FLAGS else frozenset()


def binary_flags(binary: Path) -> frozenset[str]:
    """The flags `binary --help` lists (empty when it lists none: then nothing is checked).
    Run once per binary file (path, size, mtime) for the life of the process."""
    try:
        stat = os.stat(binary)
    except OSError:
        return frozenset()
    return _flags(str(binary), stat.st_size, stat.st_mtime_ns)


def unknown_flags(args: Sequence[str], flags: frozenset[str]) -> list[UnknownFlag]:
    """The args that look like flags (`-x`, `--long`, `--long=value`) and are not in
    `flags`; none when `flags` is empty (the binary's usage could not be read)."""
    if not flags:
        return []
    unknown: list[UnknownFlag] = []
    for arg in args:
        name = str(arg).split("=", 1)[0]
        if not _IS_FLAG.match(name) or name in flags:
            continue
        close = difflib.get_close_matches(name, sorted(flags), n=1, cutoff=0.75)
        unknown.append(UnknownFlag(name, close[0] if close else None))
    return unknown


def flag_error_line(text: str | None) -> str | None:
    """The line where llama-server refused its configuration, or None."""
    if not text:
        return None
    match = _REFUSED.search(text[-20000:])
    return match.group(0).strip() if match else None
