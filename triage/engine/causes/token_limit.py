"""token-limit: the answer itself does not fit max_tokens.

Decided by lifting the limit (the `token-limit-lifted` arm: max_tokens raised to the slot's
context): when the replies then end on their own (finish `stop`) the limit was the cause,
and their lengths are the answer's natural length; when they still fail, it was not. A
multiple of the limit is no such probe: a reply that needs 500 tokens under a 24-token
limit still fails at four times it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    baseline_of,
    not_reproduced,
    removes,
    reproduces,
    share,
    suspect,
    unchanged,
)
from triage.plugin_api import Registry

ID = "token-limit"
LIFTED = "token-limit-lifted"


def natural_length(tokens: Sequence[int]) -> str:
    """ "240-520 tokens (median 380, 8 replies)" -- the measured length of replies that ended
    on their own, or "" when none did."""
    if not tokens:
        return ""
    ordered = sorted(tokens)
    median = ordered[len(ordered) // 2]
    span = f"{ordered[0]}-{ordered[-1]}" if ordered[0] != ordered[-1] else f"{ordered[0]}"
    return f"{span} tokens (median {median}, {len(ordered)} replies that ended on their own)"


def _limit_text(obs: Observations) -> str:
    limit = (obs.facts.get("request-limits") or {}).get("max_tokens")
    return f"; max_tokens is {limit}" if isinstance(limit, int) else ""


# A hand-written rule, not a declarative `Removal` (triage.causes): several arms with different
# meanings: token-limit-lifted confirms only when thinking-off shows the thought is not what
# eats the budget, and thinking-off removing the failure rejects it.
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    off, lifted = arms.get("thinking-off"), arms.get(LIFTED)
    if not reproduces(arms):
        return not_reproduced(ID, base, LIFTED)
    if base.failures > 0 and share(base, "length-stop") == 0.0:
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies ended with a length stop",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    if removes(off):
        assert off is not None
        return Verdict(
            ID,
            "rejected",
            f"with thinking off the answer fits in the original max_tokens: {off.kn()} "
            "(raising max_tokens is then no evidence for this cause)",
            refutes=["thinking-off"],
            deciding_probe="thinking-off",
        )
    limits = obs.facts.get("request-limits") or {}
    limit, slot = limits.get("max_tokens"), limits.get("n_ctx_slot")
    if lifted is None and isinstance(limit, int) and isinstance(slot, int) and limit >= slot:
        return Verdict(
            ID,
            "rejected",
            f"max_tokens {limit} reaches past the slot's context ({slot} tokens): the slot, "
            "not the limit, is what a reply runs into",
            refutes=["request-limits"],
            deciding_probe="request-limits",
        )
    if lifted is None:
        return suspect(
            ID,
            "the request sets no max_tokens below the slot's context, so lifting it cannot "
            "change anything",
            f"{LIFTED} (needs a max_tokens below the slot's context)",
            basis="untested",
        )
    need = natural_length(lifted.ended_tokens)
    need_text = f"; replies need {need}{_limit_text(obs)}" if need else ""
    # Thinking is off for the request (template render), or thinking off still ends on a
    # length stop: the reasoning channel is not what eats the budget.
    off_length = off is not None and off.ran and share(off, "length-stop") > 0.5
    no_thought = (
        obs.thinking_on_by_default is False or off is None or (unchanged(off) and off_length)
    )
    if removes(lifted) and no_thought:
        return Verdict(
            ID,
            "confirmed",
            f"with max_tokens lifted to the slot's context the replies end on their own: "
            f"{lifted.kn()} vs baseline {base.kn()} (p={lifted.p_value:.2g}){need_text}"
            + (f"; thinking off still stops on length ({off.kn()})" if off is not None else ""),
            supports=[LIFTED, *(["thinking-off"] if off is not None else [])],
            deciding_probe=LIFTED,
        )
    if unchanged(lifted):
        return Verdict(
            ID,
            "rejected",
            f"with max_tokens lifted to the slot's context the failure rate is unchanged: "
            f"{lifted.kn()} vs baseline {base.kn()} -- the replies do not end on their own"
            + (f" (those that did needed {need})" if need else ""),
            refutes=[LIFTED],
            deciding_probe=LIFTED,
        )
    return suspect(
        ID,
        f"undecided: thinking-off {off.kn() if off else 'not run'}, {LIFTED} {lifted.kn()}"
        + need_text,
        f"thinking-off + {LIFTED} with more replays",
    )


CAUSE = CauseRule(
    id=ID,
    number=5,
    title="The answer itself does not fit max_tokens",
    mechanism="even without reasoning the answer is longer than max_tokens",
    decided_by="max_tokens lifted to the slot's context: the replies then end on their own "
    "(finish stop), their lengths the answer's natural length",
    rule=rule,
    retrospective="the answer needed more tokens than the request's max_tokens allowed",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
