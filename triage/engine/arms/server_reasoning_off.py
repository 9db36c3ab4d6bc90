"""server-reasoning-off: the server started with `--reasoning off` (the first fix
candidate of a reasoning-budget failure)."""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable, requires_thinking
from triage.stackfile import Stack, set_flag


@dataclass(frozen=True)
class ServerReasoningOff:
    id: str = "server-reasoning-off"
    precondition: str = "a server started from a model file, and thinking on for the request"
    level: str = "server"
    order: int = 80

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not relaunchable(stack):
            return None
        server = stack.server
        return PlannedArm(
            self.id,
            "server started with --reasoning off (the first fix candidate)",
            self.level,
            ("reasoning-exhausts-budget",),
            config=server.with_args(set_flag(server.args, "--reasoning", "off", "-rea")),
            requires=requires_thinking,
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ServerReasoningOff())
