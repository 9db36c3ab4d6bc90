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
