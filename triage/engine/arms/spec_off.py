"""spec-off: the server without its speculative-decoding flags, plus the divergence
observation (committed streams with and without speculation at fixed seeds)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage import observe
from triage.plugin_api import Registry
from triage.probes import ObserveContext, PlannedArm, relaunchable
from triage.stackfile import Stack, has_spec_flags, strip_spec_flags


async def divergence(ctx: ObserveContext) -> Mapping[str, object]:
    return await observe.spec_divergence(
        ctx.base,
        ctx.server,
        ctx.request,
        seed=ctx.seed,
        seeds=ctx.divergence_seeds,
        timeout=ctx.timeout,
    )


@dataclass(frozen=True)
class SpecOff:
    id: str = "spec-off"
    precondition: str = "speculative-decoding flags in the server args (a model file, not a URL)"
    level: str = "server"
    order: int = 50

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or not has_spec_flags(server.args):
            return None
        return PlannedArm(
            self.id,
            "speculative-decoding flags stripped from the server args",
            self.level,
            ("speculative-decoding",),
            config=server.with_args(strip_spec_flags(server.args)),
            observe=divergence,
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(SpecOff())
