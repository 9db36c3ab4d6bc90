"""conversation-shape: a multi-turn history the chat template (or llama-server's history
parser) mishandles -- tool-call arguments that are not JSON text, tool-call ids missing or
unlinked, reasoning passed back inline or under another name, content as part lists.

Decided by the `history-normalised` arm (the last turn replayed with the history in normal
form): confirmed when it removes the failure significantly and the baseline reproduces it;
rejected when it leaves the failure unchanged, or when the request has no earlier assistant
turn (nothing for the template to mishandle -- the `conversation-history` observation).
A history these rules leave as it is stays suspected: no arm can test it.
"""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    removal_verdict,
    reproduces,
    suspect,
)
from triage.plugin_api import Registry

ID = "conversation-shape"
ARM = "history-normalised"
OBSERVATION = "conversation-history"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    facts = obs.facts.get(OBSERVATION)
    if not facts:
        why = "the conversation-history observation did not run"
        return suspect(ID, why, ARM, basis="untested")
    if not facts.get("assistant_turns"):
        return Verdict(
            ID,
            "rejected",
            "single-turn request: there is no earlier turn for the template to mishandle",
            refutes=[OBSERVATION],
            deciding_probe=OBSERVATION,
        )
    changes = ", ".join(facts.get("changes") or [])
    if not changes:
        return suspect(
            ID,
            f"{facts['assistant_turns']} earlier assistant turn(s), already in normal form: "
            "no normalisation to test",
            "the same conversation as a known-good client sends it",
            basis="untested",
        )
    base, arm = baseline_of(arms), arms.get(ARM)
    gate = arm_gate(
        ID,
        arm,
        base,
        reproduces(arms),
        ARM,
        available=ARM in obs.planned,
        missing="the history-normalised arm was not planned",
        hint="a multi-turn request",
    )
    if gate is not None:
        return gate
    assert arm is not None
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text=f"with the history normalised ({changes}) the failure goes away",
        unchanged_text=f"normalising the history ({changes}) makes no difference",
        supports=(OBSERVATION,),
    )


CAUSE = CauseRule(
    ID,
    13,
    "Conversation shape",
    "the multi-turn history is in a shape the chat template or llama-server's history parser "
    "mishandles (tool-call arguments not JSON text, unlinked tool-call ids, reasoning passed "
    "back inline), so the last turn fails",
    "history-normalised (the last turn replayed with the history normalised)",
    rule,
    retrospective=(
        "The model and server were fine; the conversation history the client sent back was "
        "in a shape the template could not handle, and the next turn failed."
    ),
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
