"""model-loop: the model falls into a repetition loop and writes it until a limit stops it
(issue 23). Decided by sampling: with repetition penalised (the `anti-repetition` arm) the
replies end on their own. A loop is not a limit: lifting max_tokens or the context only
lengthens it (token-limit and context-size are rejected by their own arms)."""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Removal, Symptom, Verdict, share, suspect, unchanged
from triage.plugin_api import Registry

ID = "model-loop"
ARM = "anti-repetition"
# What a looping answer shows: its n-grams repeat up to where a limit cut it; a looping
# thought (runaway-reasoning) is the same loop in the reasoning channel.
LOOP_KINDS = ("repetition-loop", "repetition-to-context-end", "runaway-reasoning")


def _loop_gone_failure_stays(ev: Evidence) -> Verdict | None:
    """The arm leaves the rate unchanged but its failing replies no longer loop: the loop was
    real, yet something else fails too -- neither confirmed nor rejected."""
    arm = ev.arm
    still = share(arm, *LOOP_KINDS)
    if unchanged(arm) and arm.failures and still < 0.5:
        return suspect(
            ID,
            f"with repetition penalised the loop goes ({still:.0%} of the arm's failing "
            f"replies repeat) but the replies still fail: {arm.kn()}",
            f"{ARM} with more replays, or a larger context",
        )
    return None


CAUSE = CauseRule(
    id=ID,
    number=17,
    title="The model loops",
    mechanism="the model falls into a repetition loop (a phrase, a numbered line) and writes "
    "it until max_tokens or the context end stops it",
    decided_by="the anti-repetition arm (DRY and repeat_penalty added): the replies then end "
    "on their own",
    removed_by=(ARM,),
    removal=Removal(
        symptom=Symptom(
            LOOP_KINDS,
            "{share:.0%} of the {failures} failing baseline replies repeat themselves up to "
            "where they stopped: the failure is not a loop",
            min_share=0.5,
        ),
        missing="the request already penalises repetition",
        hint="a request without DRY / repeat_penalty",
        arm_check=_loop_gone_failure_stays,
        removes_text=lambda ev: (
            f"{share(ev.base, *LOOP_KINDS):.0%} of the failing baseline "
            "replies loop; with repetition penalised (DRY, repeat_penalty) the replies end on "
            "their own"
        ),
        unchanged_text="with repetition penalised the failure rate is unchanged",
        supports=lambda ev: ("baseline", ARM),
    ),
    retrospective="the model fell into a repetition loop; penalising repetition in sampling "
    "(DRY, repeat_penalty) let it finish",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
