"""Host workarounds for DRILL servers (never for a user's own stack).

On a CPU with AMX, llama-server b11434 built with GCC 12 (GGML_NATIVE=ON) segfaults in
`ggml_backend_amx_mul_mat` during the warm-up decode of every drill model; `--no-repack`
avoids the repacked AMX path (llama.cpp#20824; `--no-warmup` does not help). Drill servers,
the demo and the test suite add it on such a host and say so; the host is detected from
/proc/cpuinfo, or from `$TRIAGE_CPU_FLAGS` so that both branches are testable anywhere.
"""

from __future__ import annotations

import shlex
import stat
from collections.abc import Iterable
from pathlib import Path

from triage.llama.crash import (
    AMX_WORKAROUND_NOTE,
    NO_REPACK_FLAG,
    host_cpu_flags,
    host_has_amx,
)

__all__ = [
    "AMX_WORKAROUND_NOTE",
    "stack_host_note",
    "host_workaround_args",
    "host_workaround_note",
    "write_workaround_wrapper",
]


def _flags(flags: Iterable[str] | None) -> frozenset[str]:
    return host_cpu_flags() if flags is None else frozenset(flags)


def host_workaround_args(flags: Iterable[str] | None = None) -> list[str]:
    """Extra server args a drill server needs on this host (["--no-repack"] on AMX, else [])."""
    return [NO_REPACK_FLAG] if host_has_amx(_flags(flags)) else []


def host_workaround_note(flags: Iterable[str] | None = None) -> str | None:
    """The note to show wherever a drill server runs with the workaround, else None."""
    return AMX_WORKAROUND_NOTE if host_workaround_args(flags) else None


def write_workaround_wrapper(
    real_binary: Path, dest: Path, flags: Iterable[str] | None = None
) -> Path | None:
    """On an AMX host, a wrapper executable at `dest` that runs `real_binary` with
    `--no-repack` added and the note printed first in its log; None (nothing written) on other
    hosts. For the test suite, whose tests start drill servers with hand-written args."""
    if not host_workaround_args(flags):
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(
        "#!/bin/sh\n"
        f"# triage test suite: {AMX_WORKAROUND_NOTE}\n"
        f"echo {shlex.quote('# ' + AMX_WORKAROUND_NOTE)} >&2\n"
        f'exec {shlex.quote(str(real_binary))} "$@" {NO_REPACK_FLAG}\n'
    )
    dest.chmod(dest.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return dest


STACK_NOTE_PREFIX = "# host workaround:"
STACK_HEAD_BYTES = 4096


def stack_host_note(stack_path: Path | str) -> str | None:
    """The host-workaround note a drill's stack.toml carries (written by
    `triage.drills.registry.write_stack` in its header comment), else None -- for the
    diagnosis's stack description. A user's own stack has none: nothing is added to it."""
    try:
        with Path(stack_path).open("rb") as handle:
            head = handle.read(STACK_HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in head.splitlines():
        if not line.startswith("#"):
            break  # only the header comment counts
        if line.startswith(STACK_NOTE_PREFIX):
            return line[2:].split(" -- ", 1)[0].strip()
    return None
