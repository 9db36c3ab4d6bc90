"""reasoning-exhausts-budget: the thought eats max_tokens."""

from __future__ import annotations

from collections.abc import Mapping

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

ID = "reasoning-exhausts-budget"
THOUGHT_LOOP = "runaway-reasoning"
ANTI_REPETITION = "anti-repetition"


# A hand-written rule, not a declarative `Removal` (triage.causes): several arms with different
# meanings: any of thinking-off / reasoning-budget / server-reasoning-off confirms it, while
# anti-repetition removing a looping thought rejects it.
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    off, budget, server_off = (
        arms.get("thinking-off"),
        arms.get("reasoning-budget"),
        arms.get("server-reasoning-off"),
    )
    if not reproduces(arms):
        return not_reproduced(ID, base, "thinking-off")
    length_share = share(base, "length-stop")
    if length_share == 0.0 and base.failures > 0:
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies ended with a length stop; "
            "a stop that is not a length stop rules out budget exhaustion",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    removing = [a for a in (off, budget, server_off) if a is not None and removes(a)]
    looping = loop_instead(arms, obs, base) if removing else None
    if looping is not None:
        return looping
    if removing:
        named = "; ".join(f"{a.name} {a.kn()}" for a in removing)
        return Verdict(
            ID,
            "confirmed",
            f"baseline fails {base.kn()}, {length_share:.0%} of failures are length stops; "
            f"with the reasoning channel removed or bounded at the original max_tokens: {named} "
            f"(p={removing[0].p_value:.2g})"
            + (
                ", thinking is on by default for this request (template render)"
                if obs.thinking_on_by_default
                else ""
            ),
            supports=["baseline", *[a.name for a in removing]],
            deciding_probe=removing[0].name,
        )
    if obs.thinking_on_by_default is False and share(base, "reasoning-exhausted-budget") == 0:
        return Verdict(
            ID,
            "rejected",
            "thinking is off for this request (template render) and no failing reply shows "
            "reasoning filling the budget",
            refutes=["template-render"],
            deciding_probe="template-render",
        )
    if unchanged(off) and (budget is None or not budget.ran or unchanged(budget)):
        assert off is not None
        return Verdict(
            ID,
            "rejected",
            f"thinking off leaves the failure rate unchanged: {off.kn()} vs baseline {base.kn()}"
            + (f"; reasoning budget {budget.kn()}" if budget and budget.ran else ""),
            refutes=["thinking-off"] + (["reasoning-budget"] if budget and budget.ran else []),
            deciding_probe="thinking-off",
        )
    return suspect(
        ID,
        f"undecided at the cap: thinking-off {off.kn() if off else 'not run'}",
        "thinking-off with more replays (--max-requests)",
    )


def loop_instead(
    arms: Mapping[str, ArmOutcome], obs: Observations, base: ArmOutcome
) -> Verdict | None:
    """A looping THOUGHT that thinking-off "fixes" (issue 23): removing the thought removes
    the loop, which says nothing about the budget. When most failing thoughts loop
    (`runaway-reasoning`), the anti-repetition arm decides: penalised repetition lets the
    replies end -> a model loop, not the budget (rejected); not decided yet -> suspected;
    the loop resists it (unchanged), or the request already penalises repetition -> the
    thought eats any budget it gets and only dropping or bounding it helps: None (the
    removing arms confirm, as for any thought that eats the budget)."""
    thought_loops = share(base, THOUGHT_LOOP)
    if thought_loops < 0.5:
        return None
    arm = arms.get(ANTI_REPETITION)
    if ANTI_REPETITION not in obs.planned or unchanged(arm):
        return None
    if removes(arm):
        assert arm is not None
        return Verdict(
            ID,
            "rejected",
            f"{thought_loops:.0%} of the failing replies' thoughts loop, and with repetition "
            f"penalised the replies end: {arm.kn()} vs baseline {base.kn()} -- a model loop "
            "in the thought, not a budget too small (thinking off only removes the looping "
            "channel)",
            refutes=[ANTI_REPETITION],
            deciding_probe=ANTI_REPETITION,
        )
    return suspect(
        ID,
        f"{thought_loops:.0%} of the failing replies' thoughts loop: thinking off removes "
        "the failure, but whether the loop or the budget is the cause is undecided until "
        f"{ANTI_REPETITION} decides ({arm.kn() if arm else 'not run'})",
        f"{ANTI_REPETITION} with more replays",
    )


CAUSE = CauseRule(
    id=ID,
    number=0,
    title="Reasoning channel exhausts the completion budget",
    mechanism="thinking is on and the thought eats max_tokens, so content is empty or cut",
    decided_by="thinking-off / reasoning-budget at the original max_tokens",
    rule=rule,
    retrospective="the model's reasoning used up the whole max_tokens budget, so the answer "
    "was empty or cut off",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
