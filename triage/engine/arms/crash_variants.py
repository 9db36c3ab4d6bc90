"""Crash-only server arms beside no-repack (issue 12: "thread count and --no-warmup arms
where they discriminate"). Planned only when the incident's server crashes or hangs (every
replay is then a launch plus one request, so a server that skips its warm-up but crashes on
the request still fails):

- no-warmup: the server started with `--no-warmup` -- decides `warmup-decode`;
- one-thread: the server with one compute thread (`-t 1 -tb 1`) -- decides `cpu-threads`;
  not planned when the stack already runs one thread (it would be the baseline again).
"""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable
from triage.stackfile import Stack

WARMUP_FLAGS = ("--no-warmup", "--warmup")
THREAD_FLAGS = ("-t", "--threads", "-tb", "--threads-batch")


def _value(args: tuple[str, ...] | list[str], *flags: str) -> str | None:
    args = list(args)
    for i, arg in enumerate(args):
        if arg in flags and i + 1 < len(args):
            return args[i + 1]
        for flag in flags:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def _without(args: tuple[str, ...] | list[str], flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        if any(arg.startswith(flag + "=") for flag in flags):
            continue
        out.append(arg)
    return out


@dataclass(frozen=True)
class NoWarmup:
    id: str = "no-warmup"
    precondition: str = "warm-up on (no --no-warmup) and a server that crashes"
    level: str = "server"
    order: int = 86

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or any(a in WARMUP_FLAGS for a in server.args):
            return None
        return PlannedArm(
            self.id,
            "server started with --no-warmup (no empty warm-up decode)",
            self.level,
            ("warmup-decode",),
            config=server.with_args([*server.args, "--no-warmup"]),
            when="crash",
        )


@dataclass(frozen=True)
class OneThread:
    id: str = "one-thread"
    precondition: str = "more than one thread and a server that crashes"
    level: str = "server"
    order: int = 87

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        single = _value(server.args, "-t", "--threads") == "1" and _value(
            server.args, "-tb", "--threads-batch"
        ) in (None, "1")
        if not relaunchable(stack) or single:
            return None
        args = [*_without(server.args, THREAD_FLAGS), "-t", "1", "-tb", "1"]
        return PlannedArm(
            self.id,
            "server with one compute thread (-t 1 -tb 1)",
            self.level,
            ("cpu-threads",),
            config=server.with_args(args),
            when="crash",
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(NoWarmup())
    catalogue.arms.add(OneThread())
