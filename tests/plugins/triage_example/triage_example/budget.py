"""Cause `unbounded-reasoning-budget` and the server-level arm that decides it.

The server is started with a thinking budget that does not bound the thought within the
request's max_tokens (`--reasoning-budget -1`, llama-server's "unrestricted", or a budget
at least as large as max_tokens), so the thought can eat the whole completion and leave
no answer. The arm `server-reasoning-budget` restarts the server with
`--reasoning-budget` at a quarter of max_tokens (llama-server then closes the thought when
the budget runs out and the model answers) and replays the unchanged request.

The arm applies only to stacks that set `--reasoning-budget` themselves: the plugin is for
operators who manage the thinking budget on the server, and every other stack's diagnosis
is left exactly as it was (no extra launch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    removal_verdict,
    reproduces,
    share,
)
from triage.probes import PlannedArm, max_tokens_of, relaunchable
from triage.stackfile import Stack, set_flag
from triage_example.thought import KIND as ALL_THOUGHT

ID = "unbounded-reasoning-budget"
NUMBER = 32  # stable: plugins number from 32 (triage/plugin_api.py PLUGIN_FIRST)
ARM = "server-reasoning-budget"
FLAG = "--reasoning-budget"
# The bounded budget the arm tries: a quarter of max_tokens leaves the answer the rest.
BUDGET_SHARE = 4
MIN_BUDGET = 16


def reasoning_budget_of(args: tuple[str, ...] | list[str]) -> int | None:
    """The server's own `--reasoning-budget N` (or `--reasoning-budget=N`); None if unset
    or not an integer."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == FLAG and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(FLAG + "="):
            value = arg.split("=", 1)[1]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def unbounded(budget: int | None, max_tokens: int) -> bool:
    """Does the server's budget leave the thought free to fill max_tokens?"""
    return budget is not None and (budget < 0 or budget >= max_tokens)


@dataclass(frozen=True)
class ServerReasoningBudget:
    """Server-level probe arm: the same server with a bounded thinking budget."""

    id: str = ARM
    level: str = "server"
    order: int = 95

    def plan(self, stack: Stack, request: dict[str, Any]) -> PlannedArm | None:
        limit = max_tokens_of(request)
        server = stack.server
        if not relaunchable(stack) or limit is None:
            return None
        if not unbounded(reasoning_budget_of(server.args), limit):
            return None  # not opted in, or the server already bounds the thought
        budget = max(MIN_BUDGET, limit // BUDGET_SHARE)
        args = set_flag(server.args, FLAG, str(budget))
        return PlannedArm(
            self.id,
            f"server started with {FLAG} {budget} (a quarter of max_tokens {limit})",
            self.level,
            (ID,),
            config=server.with_args(args),
        )


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    gate = arm_gate(
        ID,
        arm,
        base,
        reproduces(arms),
        ARM,
        available=ARM in obs.planned,
        missing=f"the stack sets no unbounded {FLAG} of its own",
        hint=f"a stack whose server runs with {FLAG} -1 and a request with max_tokens",
    )
    if gate is not None:
        return gate
    assert arm is not None
    if base.failures > 0 and share(base, ALL_THOUGHT) == 0.0:
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies is all thought "
            f"({ALL_THOUGHT}); an unbounded thought cannot be what fails",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text=f"with a bounded {FLAG} the thought ends and the model answers",
        unchanged_text=f"a bounded {FLAG} leaves the failure rate unchanged",
        note=f"; {share(base, ALL_THOUGHT):.0%} of failing baseline replies are all thought",
        supports=("baseline",),
    )


CAUSE = CauseRule(
    id=ID,
    number=NUMBER,
    title="The server's reasoning budget does not bound the thought",
    mechanism=f"llama-server runs with an unrestricted {FLAG} (or one >= max_tokens), so "
    "the thought can use the whole completion and the answer is never written",
    decided_by=f"the {ARM} server arm ({FLAG} at a quarter of max_tokens)",
    rule=rule,
    retrospective=f"llama-server let the model think without a budget; with {FLAG} set "
    "below max_tokens the model answered",
)
