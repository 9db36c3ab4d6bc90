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

from triage.causes import CauseRule, Evidence, Removal, Verdict, suspect
from triage.plugin_api import Registry

ID = "conversation-shape"
ARM = "history-normalised"
OBSERVATION = "conversation-history"


def _nothing_to_normalise(ev: Evidence) -> Verdict | None:
    """Decided by the conversation-history observation, before any replay: a single-turn
    request (rejected), or a history already in normal form (untested)."""
    facts = ev.obs.facts.get(OBSERVATION)
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
    if not _changes(ev):
        return suspect(
            ID,
            f"{facts['assistant_turns']} earlier assistant turn(s), already in normal form: "
            "no normalisation to test",
            "the same conversation as a known-good client sends it",
            basis="untested",
        )
    return None


def _changes(ev: Evidence) -> str:
    return ", ".join((ev.obs.facts.get(OBSERVATION) or {}).get("changes") or [])


CAUSE = CauseRule(
    ID,
    13,
    "Conversation shape",
    "the multi-turn history is in a shape the chat template or llama-server's history parser "
    "mishandles (tool-call arguments not JSON text, unlinked tool-call ids, reasoning passed "
    "back inline), so the last turn fails",
    "history-normalised (the last turn replayed with the history normalised)",
    removed_by=(ARM,),
    removal=Removal(
        precheck=_nothing_to_normalise,
        missing="the history-normalised arm was not planned",
        hint="a multi-turn request",
        removes_text=lambda ev: (
            f"with the history normalised ({_changes(ev)}) the failure goes away"
        ),
        unchanged_text=lambda ev: f"normalising the history ({_changes(ev)}) makes no difference",
        supports=lambda ev: (OBSERVATION,),
    ),
    retrospective=(
        "The model and server were fine; the conversation history the client sent back was "
        "in a shape the template could not handle, and the next turn failed."
    ),
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
