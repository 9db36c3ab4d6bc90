"""Known-good search: delta debugging over what differs between the failing configuration
and the last one that worked, each configuration decided by the same sequential rule.

Pure: `next_arm` says which configuration to run next given the decisions so far (None:
the search is over), `result` turns the decisions into the `known-good-search`
observation. The executor runs the arms; nothing here calls back into it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triage import probes
from triage.stackfile import ServerConfig, Stack

__all__ = ["KnownGoodArm", "next_arm", "result"]

FULL = "known-good"


@dataclass(frozen=True)
class KnownGoodArm:
    """One configuration of the search: some dimensions reverted to their known-good values."""

    name: str
    dimensions: frozenset[str]

    @property
    def variant(self) -> str:
        return "known-good values for: " + ", ".join(sorted(self.dimensions))

    def config(self, stack: Stack) -> ServerConfig:
        return probes.revert_dimensions(stack, set(self.dimensions))


def _tried(dims: Mapping[str, Any], decisions: Mapping[str, str]) -> list[KnownGoodArm]:
    """First each dimension reverted alone, then (if none alone removes the failure and
    there are more than two) pairs, then the full known-good configuration."""
    names = sorted(dims)
    singles = [KnownGoodArm(f"known-good:revert-{dim}", frozenset({dim})) for dim in names]
    if any(arm.name not in decisions for arm in singles):
        return singles
    arms = list(singles)
    if "removes" not in [decisions[a.name] for a in singles] and len(names) > 2:
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                arms.append(KnownGoodArm(f"known-good:revert-{a}+{b}", frozenset({a, b})))
    return arms


def next_arm(dims: Mapping[str, Any], decisions: Mapping[str, str]) -> KnownGoodArm | None:
    """The next configuration to run, given the decisions of those run so far."""
    for arm in [*_tried(dims, decisions), KnownGoodArm(FULL, frozenset(dims))]:
        if arm.name not in decisions:
            return arm
    return None


def result(dims: Mapping[str, tuple[Any, Any]], decisions: Mapping[str, str]) -> dict[str, Any]:
    """The `known-good-search` observation: the dimensions needed to bring the failure back."""
    tried = {arm.name: set(arm.dimensions) for arm in _tried(dims, decisions)}
    needed = sorted(
        {
            d
            for arm, subset in tried.items()
            if decisions[arm] == "removes" and len(subset) == 1
            for d in subset
        }
    )
    if not needed:
        pairs = [
            sorted(s) for arm, s in tried.items() if decisions[arm] == "removes" and len(s) == 2
        ]
        needed = sorted({d for pair in pairs for d in pair})
    return {
        "name": "known-good-search",
        "dimensions": {k: [str(v[0]), str(v[1])] for k, v in dims.items()},
        "needed_to_reproduce": needed,
        "known_good_removes": decisions[FULL] == "removes",
        "arms": {arm: decisions[arm] for arm in [*tried, FULL]},
    }
