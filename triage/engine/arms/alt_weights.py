"""alt-weights: the alternate weights file, plus the confounder observation (does it also
change the chat template or the thinking default?)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kb.jsontypes import JsonObject
from triage import observe
from triage.llama.gguf_diff import conversion_differences
from triage.plugin_api import Registry
from triage.probes import ObserveContext, PlannedArm, relaunchable
from triage.stackfile import ServerConfig, Stack


async def confounder(ctx: ObserveContext) -> Mapping[str, object]:
    """What else the alternate file changes; plus, for `model-file`, what its conversion
    changes (tokenizer metadata, template) beside the tensors."""
    facts = await observe.weights_confounder(ctx.base, ctx.server, ctx.request, timeout=ctx.timeout)
    try:
        facts["conversion_differs"] = conversion_differences(
            Path(str(ctx.base.config.model)), Path(str(ctx.server.config.model))
        )
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        facts.setdefault("errors", []).append(f"conversion metadata: {exc}")
    return facts


@dataclass(frozen=True)
class AltWeights:
    id: str = "alt-weights"
    precondition: str = "an [alternates] model in the stack"
    level: str = "server"
    order: int = 60

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if not relaunchable(stack) or stack.alternate_model is None:
            return None
        server = stack.server
        return PlannedArm(
            self.id,
            f"alternate weights {Path(stack.alternate_model).name}",
            self.level,
            ("quantized-weights", "model-file"),
            config=ServerConfig(server.binary, stack.alternate_model, server.args),
            observe=confounder,
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(AltWeights())
