"""context-size: prompt + completion do not fit the per-slot context (`-c / -np`), or the
prompt itself does not: the reply stops early (finish `length` before max_tokens) or the
server refuses the request ("exceeds the available context size"). Raising max_tokens
does nothing; a larger `-c` with the same `-np` removes it. Decided by the `context-lifted`
server arm (the context lifted to what the reply can need, bounded by the trained context),
with the `context-fill` observation (per-slot n_ctx vs tokens used); the replies that then
end on their own give the tokens the request needs, reported against the slot."""

from __future__ import annotations

from typing import cast

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Evidence,
    Observations,
    Removal,
    Symptom,
    Verdict,
    suspect,
)
from triage.engine.arms.context_size import ContextFill, context_plan, unplanned_reason
from triage.engine.causes.token_limit import natural_length
from triage.plugin_api import Registry

ID = "context-size"
ARM = "context-lifted"
FACTS = "context-fill"
# What a reply that ran out of context shows: a length stop, or the server's refusal.
CONTEXT_KINDS = ("length-stop", "http-error", "repetition-to-context-end")


def _fill_note(fill: ContextFill) -> str:
    if fill.get("exceeded"):
        return (
            f"; the server refused the prompt ({fill.get('prompt_tokens')} tokens) for a "
            f"{fill.get('n_ctx_slot')}-token slot context"
        )
    if fill.get("tokens_used") is not None and fill.get("n_ctx_slot") is not None:
        arm = fill.get("arm") or {}
        larger = f", {arm['n_ctx_slot']} with the larger -c" if arm.get("n_ctx_slot") else ""
        return (
            f"; the reply used {fill['tokens_used']} of the slot's {fill['n_ctx_slot']} "
            f"context tokens{larger}"
        )
    return ""


def _missing(ev: Evidence) -> str:
    """Why the context-lifted arm is not in the plan, with the numbers that say so."""
    obs = ev.obs
    n_ctx = (obs.facts.get("server-props") or {}).get("n_ctx_slot")
    if obs.stack is None or obs.request is None:
        return "the server sets no explicit -c, or the request provably fits its slot"
    return unplanned_reason(context_plan(obs.stack, obs.request), n_ctx)


def _fill(obs: Observations) -> ContextFill:
    # The facts the context-lifted arm's hook stored under its name (a ContextFill).
    return cast(ContextFill, obs.facts.get(FACTS) or {})


def _always_fits(ev: Evidence) -> Verdict | None:
    """Rejected without the arm: prompt + max_tokens provably fit the slot."""
    fill = _fill(ev.obs)
    if not fill.get("always_fits"):
        return None
    return Verdict(
        ID,
        "rejected",
        f"the prompt ({fill.get('prompt_tokens')} tokens) plus max_tokens "
        f"({fill.get('max_tokens')}) fits the slot's {fill.get('n_ctx_slot')}-token "
        "context: no reply to this request can reach the context end",
        refutes=[FACTS],
        deciding_probe=FACTS,
    )


def _stopped_before_the_end(ev: Evidence) -> Verdict | None:
    """A length stop observed before the context end: the context did not cut it."""
    fill = _fill(ev.obs)
    if fill.get("reached_context") is False and fill.get("finish_reason") == "length":
        return suspect(
            ID,
            f"{ARM} {ev.arm.kn()}, but the observed length stop came before the context end"
            f"{_fill_note(fill)}",
            f"{ARM} with more replays",
        )
    return None


def _need_note(arm: ArmOutcome, fill: ContextFill) -> str:
    """ "; replies need 342-554 tokens (prompt 40 + answers 302-514, median 427, 6 replies
    that ended on their own) vs the slot's 256" -- tokens needed vs slot, measured."""
    if not arm.ended_tokens:
        return ""
    prompt, slot = fill.get("prompt_tokens"), fill.get("n_ctx_slot")
    answers = natural_length(arm.ended_tokens)
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        return f"; the answers need {answers}" + (f" vs the slot's {slot}" if slot else "")
    low, high = prompt + min(arm.ended_tokens), prompt + max(arm.ended_tokens)
    span = f"{low}-{high}" if low != high else f"{low}"
    vs = f" vs the slot's {slot}" if isinstance(slot, int) else ""
    return f"; replies need {span} tokens (prompt {prompt} + answers of {answers}){vs}"


CAUSE = CauseRule(
    id=ID,
    number=8,
    title="The request does not fit the per-slot context",
    mechanism="prompt + completion exceed the server's per-slot context (-c / -np): the "
    "reply stops early or the prompt is refused, whatever max_tokens says",
    decided_by="the context-lifted server arm (same -np, -c lifted to what the reply can "
    "need) and the context-fill observation (per-slot n_ctx vs tokens used)",
    removed_by=(ARM,),
    removal=Removal(
        symptom=Symptom(
            CONTEXT_KINDS,
            "none of the {failures} failing baseline replies stopped on a limit or was "
            "refused: a reply cut by the context ends with a length stop or an error",
        ),
        precheck=_always_fits,
        missing=_missing,
        hint="a stack whose server args set -c and a request that can reach it",
        arm_check=_stopped_before_the_end,
        removes_text="with the context lifted (same slots) the replies end on their own",
        unchanged_text="the context lifted (same slots) leaves the failure rate unchanged",
        note=lambda ev: _fill_note(_fill(ev.obs)) + _need_note(ev.arm, _fill(ev.obs)),
        supports=lambda ev: (FACTS,) if _fill(ev.obs).get("reached_context") else (),
    ),
    retrospective="the request did not fit the server's per-slot context (-c divided by "
    "-np), so the reply was cut at the context end; a larger -c let it finish",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
