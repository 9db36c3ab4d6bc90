"""Crash-only causes beside cpu-backend, each decided by its server arm when the incident's
server crashes or hangs (triage/engine/arms/crash_variants.py):

- warmup-decode: only the empty warm-up decode at startup crashes; with `--no-warmup` the
  server starts AND serves the request (a crash on the request still fails the replay);
- cpu-threads: a multi-threaded CPU kernel (a race between compute threads); with one
  thread the server starts and serves.

Built-in numbers 15 and 16, declared below (triage/plugin_api.py).
"""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Removal
from triage.plugin_api import Registry

CRASH_FACTS = ("startup-crash", "mid-request-crash", "server-hang")
HINT = "a stack whose server crashes or hangs"


def _crash(ev: Evidence) -> tuple[str, ...]:
    return tuple(name for name in CRASH_FACTS if name in ev.obs.facts)


WARMUP = CauseRule(
    id="warmup-decode",
    number=15,
    title="The warm-up decode at startup",
    mechanism="the empty warm-up run llama-server does before serving crashes; real "
    "requests do not",
    decided_by="the no-warmup server arm when the server crashes or hangs",
    removed_by=("no-warmup",),
    removal=Removal(
        missing="the stack already sets the warm-up flag",
        hint=HINT,
        removes_text="with --no-warmup the server starts and serves the request",
        unchanged_text="with --no-warmup the server still crashes (at startup or on the request)",
        supports=_crash,
    ),
    retrospective="llama-server crashed in its warm-up decode; it ran with --no-warmup",
    when="crash",
)

THREADS = CauseRule(
    id="cpu-threads",
    number=16,
    title="A multi-threaded CPU kernel (thread race)",
    mechanism="compute threads race in a CPU kernel; one thread does not crash",
    decided_by="the one-thread server arm when the server crashes or hangs",
    removed_by=("one-thread",),
    removal=Removal(
        missing="the server already runs one compute thread",
        hint=HINT,
        removes_text="with one compute thread (-t 1 -tb 1) the server starts and serves",
        unchanged_text="with one compute thread the server still crashes",
        supports=_crash,
    ),
    retrospective="llama-server crashed with several compute threads; it ran with -t 1",
    when="crash",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(WARMUP)
    catalogue.causes.add(THREADS)
