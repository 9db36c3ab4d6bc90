"""no-repack: the server with `--no-repack` (weights used as stored, no repacked CPU
layout such as AMX). Runs only when the incident's server crashes at startup."""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable
from triage.stackfile import Stack

REPACK_FLAGS = ("--no-repack", "-nr", "--repack")


@dataclass(frozen=True)
class NoRepack:
    id: str = "no-repack"
    precondition: str = "repacking on (no --no-repack) and a server that crashes"
    level: str = "server"
    order: int = 85

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or any(a in REPACK_FLAGS for a in server.args):
            return None
        return PlannedArm(
            self.id,
            "server started with --no-repack (no repacked CPU weights)",
            self.level,
            ("cpu-backend",),
            config=server.with_args([*server.args, "--no-repack"]),
            when="crash",
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(NoRepack())
