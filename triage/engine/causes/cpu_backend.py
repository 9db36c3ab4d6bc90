"""cpu-backend: a CPU kernel or the repacked-weights path crashes the server (e.g. the AMX
repack path of llama.cpp#20824). Decided, when the incident's server crashes at startup,
by the `no-repack` server arm."""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Removal
from triage.plugin_api import Registry


def _where(ev: Evidence) -> str:
    """What the startup crash showed, for the rationale."""
    crash = ev.obs.facts.get("startup-crash") or {}
    where = ""
    if crash:
        where = f"; crash: {crash.get('signal')}"
        if crash.get("backtrace_symbol"):
            where += f" in {crash['backtrace_symbol']}"
        if crash.get("repack"):
            where += ", the server's system_info shows REPACK = 1"
        if crash.get("amx_lines"):
            where += ", AMX in use"
    return where


CAUSE = CauseRule(
    id="cpu-backend",
    number=6,
    title="A CPU backend kernel / the repacked weight path",
    mechanism="the CPU backend's repacked weights path (e.g. AMX) crashes or corrupts the "
    "computation on this host",
    decided_by="the no-repack server arm when the server crashes at startup",
    removed_by=("no-repack",),
    removal=Removal(
        missing="the server does not run on a CPU backend that repacks weights",
        hint="a stack whose server crashes at startup",
        removes_text="without weight repacking (--no-repack) the server starts and serves",
        unchanged_text="without weight repacking the server still crashes",
        note=_where,
        supports=lambda ev: ("startup-crash",),
    ),
    retrospective="llama-server crashed on this host's CPU backend (repacked weights path); "
    "it ran with --no-repack",
    when="crash",  # only decided when the incident's server crashes at startup
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
