"""Known-good search: delta debugging over what differs between the failing configuration
and the last one that worked, each configuration decided by the same sequential rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triage import probes
from triage.stackfile import ServerConfig, Stack

__all__ = ["search"]

# (arm name, variant, config) -> the arm's decision once run
RunArm = Callable[[str, str, ServerConfig], str]


def _run(run_arm: RunArm, stack: Stack, name: str, subset: set[str]) -> str:
    config = probes.revert_dimensions(stack, subset)
    variant = "known-good values for: " + ", ".join(sorted(subset))
    return run_arm(name, variant, config)


def search(stack: Stack, dims: dict[str, tuple[Any, Any]], run_arm: RunArm) -> dict[str, Any]:
    """First each dimension reverted alone, then (if none alone removes the failure and
    there are more than two) pairs, then the full known-good configuration. Returns the
    `known-good-search` observation."""
    names = sorted(dims)
    tried: dict[str, set[str]] = {f"known-good:revert-{dim}": {dim} for dim in names}
    decisions = {arm: _run(run_arm, stack, arm, subset) for arm, subset in tried.items()}
    if "removes" not in decisions.values() and len(names) > 2:
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                arm = f"known-good:revert-{a}+{b}"
                tried[arm] = {a, b}
                decisions[arm] = _run(run_arm, stack, arm, {a, b})
    decisions["known-good"] = _run(run_arm, stack, "known-good", set(names))
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
        "known_good_removes": decisions["known-good"] == "removes",
        "arms": {arm: decisions[arm] for arm in [*tried, "known-good"]},
    }
