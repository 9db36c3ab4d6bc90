"""alt-build: the same weights and flags on an alternate llama-server binary."""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable
from triage.stackfile import ServerConfig, Stack


@dataclass(frozen=True)
class AltBuild:
    id: str = "alt-build"
    precondition: str = "an [alternates] binary in the stack"
    level: str = "server"
    order: int = 70

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not relaunchable(stack) or stack.alternate_binary is None:
            return None
        server = stack.server
        return PlannedArm(
            self.id,
            f"alternate binary {stack.alternate_binary}",
            self.level,
            ("server-build",),
            config=ServerConfig(stack.alternate_binary, server.model, server.args),
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(AltBuild())
