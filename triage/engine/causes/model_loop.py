"""model-loop: the model falls into a repetition loop and writes it until a limit stops it
(issue 23). Decided by sampling: with repetition penalised (the `anti-repetition` arm) the
replies end on their own. A loop is not a limit: lifting max_tokens or the context only
lengthens it (token-limit and context-size are rejected by their own arms)."""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    not_reproduced,
    removes,
    reproduces,
    share,
    suspect,
    unchanged,
)
from triage.plugin_api import Registry

ID = "model-loop"
ARM = "anti-repetition"
# What a looping answer shows: its n-grams repeat up to where a limit cut it; a looping
# thought (runaway-reasoning) is the same loop in the reasoning channel.
LOOP_KINDS = ("repetition-loop", "repetition-to-context-end", "runaway-reasoning")


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    if not reproduces(arms):
        return not_reproduced(ID, base, ARM)
    looping = share(base, *LOOP_KINDS)
    if base.failures > 0 and looping < 0.5:
        return Verdict(
            ID,
            "rejected",
            f"{looping:.0%} of the {base.failures} failing baseline replies repeat themselves "
            "up to where they stopped: the failure is not a loop",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    gate = arm_gate(
        ID,
        arm,
        base,
        True,
        ARM,
        available=ARM in obs.planned,
        missing="the request already penalises repetition",
        hint="a request without DRY / repeat_penalty",
    )
    if gate is not None:
        return gate
    assert arm is not None
    if removes(arm):
        return Verdict(
            ID,
            "confirmed",
            f"{looping:.0%} of the failing baseline replies loop; with repetition penalised "
            f"(DRY, repeat_penalty) the replies end on their own: {arm.kn()} vs baseline "
            f"{base.kn()} (p={arm.p_value:.2g})",
            supports=["baseline", ARM],
            deciding_probe=ARM,
        )
    if unchanged(arm):
        still = share(arm, *LOOP_KINDS)
        if arm.failures and still < 0.5:
            return suspect(
                ID,
                f"with repetition penalised the loop goes ({still:.0%} of the arm's failing "
                f"replies repeat) but the replies still fail: {arm.kn()}",
                f"{ARM} with more replays, or a larger context",
            )
        return Verdict(
            ID,
            "rejected",
            f"with repetition penalised the failure rate is unchanged: {arm.kn()} vs "
            f"baseline {base.kn()}",
            refutes=[ARM],
            deciding_probe=ARM,
        )
    return suspect(ID, f"undecided at the cap: {ARM} {arm.kn()}", f"{ARM} with more replays")


CAUSE = CauseRule(
    id=ID,
    number=17,
    title="The model loops",
    mechanism="the model falls into a repetition loop (a phrase, a numbered line) and writes "
    "it until max_tokens or the context end stops it",
    decided_by="the anti-repetition arm (DRY and repeat_penalty added): the replies then end "
    "on their own",
    rule=rule,
    retrospective="the model fell into a repetition loop; penalising repetition in sampling "
    "(DRY, repeat_penalty) let it finish",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
