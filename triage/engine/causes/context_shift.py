"""context-shift: a request without max_tokens on a server with context shift on never
reaches an end: at the context end the server discards half the context (the prompt
first) and generation goes on, typically looping, until the client gives up. Decided by
the `context-shift-off` server arm (`--no-context-shift`); `max-tokens-set` (the request
with a max_tokens) is supporting evidence only: it bounds any generation, shift or not."""

from __future__ import annotations

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Evidence,
    Removal,
    Symptom,
    Verdict,
    removes,
    suspect,
)
from triage.plugin_api import Registry

ID = "context-shift"
OFF = "context-shift-off"
CAP = "max-tokens-set"
# What an unbounded generation shows: a loop up to the context end, or no end at all.
UNBOUNDED_KINDS = ("repetition-to-context-end", "timeout", "server-hang")


def _cap_note(cap: ArmOutcome | None) -> str:
    return f"; with max_tokens set: {cap.kn()}" if cap is not None and cap.ran else ""


def _not_comparable(ev: Evidence) -> Verdict | None:
    """No server with context shift off in the plan: at most the max_tokens bound speaks."""
    if OFF in ev.obs.planned:
        return None
    base, cap = ev.base, ev.arms.get(CAP)
    if removes(cap):
        assert cap is not None
        return suspect(
            ID,
            f"a max_tokens bound removes the failure ({cap.kn()} vs baseline "
            f"{base.kn()}), but no server with context shift off could be compared",
            f"{OFF} (a server started with --context-shift)",
            supports=[CAP],
        )
    return suspect(
        ID,
        "not testable with this stack: the request sets max_tokens, or the server's args "
        f"do not switch context shift on (or it cannot be relaunched){_cap_note(cap)}",
        f"{OFF} (a server started with --context-shift, a request without max_tokens)",
        basis="untested" if cap is None or not cap.ran else "measured",
    )


CAUSE = CauseRule(
    id=ID,
    number=9,
    title="Context shift lets a request without max_tokens run away",
    mechanism="with no max_tokens and context shift on, the server drops the start of the "
    "context at its end and generation goes on, looping or never ending",
    decided_by="the context-shift-off server arm (--no-context-shift); max-tokens-set supports it",
    removed_by=(OFF,),
    removal=Removal(
        symptom=Symptom(
            UNBOUNDED_KINDS,
            "none of the {failures} failing baseline replies ran unbounded: none repeats "
            "itself up to a context end the client did not set, none timed out",
        ),
        precheck=_not_comparable,
        hint="a server started with --context-shift",
        removes_text="with --no-context-shift the generation ends (at the latest at the "
        "context end) instead of running on",
        unchanged_text="with --no-context-shift the reply fails the same way (the loop is "
        "the model's own, not the shift's)",
        note=lambda ev: _cap_note(ev.arms.get(CAP)),
        supports=lambda ev: (CAP,) if removes(ev.arms.get(CAP)) else (),
    ),
    retrospective="a request without max_tokens ran into llama-server's context shift and "
    "never came to an end; --no-context-shift (or a max_tokens) bounded it",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
