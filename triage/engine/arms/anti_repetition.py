"""anti-repetition: the request replayed with repetition penalised -- DRY (multiplier 0.8,
base 1.75, allowed length 2) and repeat_penalty 1.1 -- the first fix a looping model gets.
Decides model-loop: a loop that these sampling settings break ends on its own.

Measured on SmolLM2-135M at temperature 0 (issue 23): "Write a long poem about the sea."
loops on "Abe aria, aria of the sea," until the context ends (986 tokens); with these
settings it ends on its own after 257 tokens; "List the steps to bake bread." loops on
"51. Let the bread rest..." to the context end, and ends after 678 tokens with them."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm
from triage.stackfile import Stack

ARM = "anti-repetition"
SETTINGS: dict[str, float | int] = {
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "repeat_penalty": 1.1,
}


def penalises_repetition(request: JsonObject) -> bool:
    """Does the request already penalise repetition (DRY on, or a repeat penalty)?"""
    dry, penalty = request.get("dry_multiplier"), request.get("repeat_penalty")
    return (isinstance(dry, (int, float)) and dry > 0) or (
        isinstance(penalty, (int, float)) and penalty > 1.0
    )


def with_anti_repetition(request: JsonObject) -> JsonObject:
    body = copy.deepcopy(request)
    body.update(SETTINGS)
    return body


@dataclass(frozen=True)
class AntiRepetition:
    id: str = ARM
    precondition: str = "a request that does not already penalise repetition (DRY, repeat_penalty)"
    level: str = "request"
    order: int = 60

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if penalises_repetition(request):
            return None
        return PlannedArm(
            self.id,
            "DRY 0.8 / 1.75 / 2 and repeat_penalty 1.1 added to the request",
            self.level,
            # reasoning-exhausts-budget reads it too: a looping thought that penalised
            # repetition lets end is a model loop, not a budget too small.
            ("model-loop", "reasoning-exhausts-budget"),
            with_anti_repetition,
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(AntiRepetition())
