"""Arms held back until nothing else explains the failure (issue 23): the request-field
ablation arms (`when = "unexplained"`, triage/engine/arms/ablation.py). They cost replays
that a diagnosis which found its cause does not need, so the runner plans them aside and
runs them only after every other arm, when the baseline reproduced and no cause is
confirmed; their outcomes name the request fields that carry the failure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kb.domain.diagnosis import DiagnosisArm
from triage.causes import Verdict
from triage.engine.arms.ablation import HELD_BACK

__all__ = ["HELD_BACK", "carrying_fields", "is_held_back", "not_needed"]

ARM_PREFIX = "without-"


def is_held_back(planned: Any) -> bool:
    return getattr(planned, "when", "always") == HELD_BACK


def not_needed(verdicts: Iterable[Verdict], reproduced: bool) -> str | None:
    """Why the held-back arms need not run (None: run them)."""
    if not reproduced:
        return "runs only when the failure reproduces"
    confirmed = [v.cause for v in verdicts if v.status == "confirmed"]
    if confirmed:
        return f"runs only when no cause is confirmed ({', '.join(confirmed)} is)"
    return None


def carrying_fields(arms: Sequence[DiagnosisArm]) -> list[str]:
    """The ablation arms whose removal removed the failure, each with its k/n vs the
    baseline's: "stop (without-stop 0/8 vs baseline 8/8, p=0.0039)"."""
    base = next((a for a in arms if a.name == "baseline"), None)
    against = f" vs baseline {base.failures}/{base.n}" if base is not None else ""
    out = []
    for arm in arms:
        if arm.name.startswith(ARM_PREFIX) and arm.decision == "removes":
            p = arm.p_less if arm.p_less is not None else arm.p_value
            p_text = f", p={p:.2g}" if p is not None else ""
            field = arm.name.removeprefix(ARM_PREFIX)
            out.append(f"{field} ({arm.name} {arm.failures}/{arm.n}{against}{p_text})")
    return out
