"""Step 3 of a diagnosis, pure: the cause rules over what the replays showed.

`Rules` is the cause rules with this run's facts -- what the scheduler's moot check asks
while the run goes on, and what `decide` asks at its end. `decide` turns the executed run
(`Execution`) into a `Decision`: arm summaries, verdicts, the run's state, the observations
to store. It copies the arms it settles; nothing is written here (triage.engine.record)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kb.domain.diagnosis import Reproduction, RunCost, StackSummary
from kb.domain.records import ArmSummary
from kb.repo import runs
from triage import causes as cause_rules
from triage.causes import BASELINE, ArmOutcome, Verdict
from triage.drills.host import stack_host_note
from triage.engine.diagnosis import arm_summary, server_seconds, stack_summary
from triage.engine.plan import Plan
from triage.engine.scheduler import ArmState, no_replies
from triage.engine.servers import Server, scrub_secrets
from triage.stackfile import Stack

__all__ = ["Decision", "Execution", "Rules", "decide"]


@dataclass
class Execution:
    """What `execute` hands on: the plan as it ended (arms dropped once the observations
    refuted their precondition, crash mode), every arm's replies and state, the facts
    observed, the servers that ran, and the reproduction gate's outcome."""

    plan: Plan
    arms: dict[str, ArmState]
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    servers: dict[str, Server] = field(default_factory=dict)
    reproduction: Reproduction | None = None
    crash: dict[str, Any] | None = None  # facts of the incident's server's crash (crash mode)

    @property
    def gate_failed(self) -> bool:
        return self.reproduction is not None and not self.reproduction.reproduced


@dataclass
class Rules:
    """The cause rules with this run's facts (a `Judge` for the scheduler's moot check)."""

    execution: Execution

    def observations(self) -> cause_rules.Observations:
        run = self.execution
        return cause_rules.observations_from(
            run.facts,
            run.plan.stack,
            speculative=self._speculative(),
            planned=tuple(run.plan.arms),
            request=run.plan.request,
        )

    def verdicts(self, outcomes: Mapping[str, ArmOutcome]) -> list[Verdict]:
        return cause_rules.decide(outcomes, self.observations(), self.execution.plan.causes)

    def __call__(self, outcomes: Mapping[str, ArmOutcome]) -> dict[str, str]:
        return {v.cause: v.status for v in self.verdicts(outcomes)}

    def _speculative(self) -> bool:
        """Speculative decoding is on: flags in the stack, the server's /props, or draft
        tokens in the baseline's timings (a URL stack shows it only there)."""
        run = self.execution
        if run.plan.stack.speculative or run.facts.get("server-props", {}).get("speculative"):
            return True
        baseline = run.arms.get(BASELINE)
        return baseline is not None and any(
            int(r.timings.get("draft_n", 0) or 0) > 0 for r in baseline.replies
        )


@dataclass(frozen=True)
class Decision:
    """What `record` writes and the diagnosis shows."""

    state: str  # done | partial | not-reproduced
    summaries: list[ArmSummary]
    facts: dict[str, dict[str, Any]]
    verdicts: list[Verdict]  # shown in the diagnosis (none when the gate failed)
    rows: list[runs.VerdictRow] | None  # applied to the causes (None: no cause moves)
    errors: list[str]
    stack: StackSummary
    cost: RunCost
    reproduction: Reproduction | None

    @property
    def gate_failed(self) -> bool:
        return self.state == "not-reproduced"


def decide(execution: Execution, secrets: list[str], wall_seconds: float) -> Decision:
    """The verdicts and arm summaries of an executed run; error texts, log tails and facts
    scrubbed of the stack's secret flag values."""
    arms = {name: dataclasses.replace(arm) for name, arm in execution.arms.items()}
    settled = dataclasses.replace(execution, arms=arms)
    gate_failed = execution.gate_failed
    for arm in arms.values():
        no_replies(arm)  # replays that all ended without an answer: errored, with why
    rules = Rules(settled)
    obs = rules.observations()
    verdicts = rules.verdicts({n: a.outcome() for n, a in arms.items()})
    for arm in arms.values():  # an error or log tail may quote a launch argv
        arm.error = scrub_secrets(arm.error, secrets)
        arm.log_tail = scrub_secrets(arm.log_tail, secrets)
    facts: dict[str, dict[str, Any]] = scrub_secrets(dict(execution.facts), secrets)
    for arm in arms.values():
        if not arm.n and not arm.error:  # never silently 0/0 (issue 28)
            arm.decision = "not-run"
            arm.stopped = arm.stopped or "the run ended before this arm replayed"
    summaries = [arm_summary(a) for a in arms.values()]
    if gate_failed:
        # A baseline that failed differently is not the incident's baseline: keep its
        # replies as a reproduction measurement, never as a `baseline` arm.
        summaries = []
        assert execution.reproduction is not None  # the gate failed
        facts["reproduction"] = {
            "name": "reproduction",
            **execution.reproduction.to_json(),
            "summary": execution.reproduction.message,
            "baseline": arm_summary(arms[BASELINE]).to_dict(),
        }
    errored = [a for a in arms.values() if a.error]
    unrun = [] if gate_failed else [a for a in arms.values() if not a.n and not a.error]
    # A run with an arm that got no reply did not finish its job: not "done".
    state = "not-reproduced" if gate_failed else ("partial" if errored or unrun else "done")
    stack = execution.plan.stack
    return Decision(
        state=state,
        summaries=summaries,
        facts=facts,
        verdicts=[] if gate_failed else verdicts,
        rows=None if gate_failed else [_row(v) for v in verdicts],
        errors=[f"arm {a.name} errored: {a.error}" for a in errored]
        + [f"arm {a.name} not run: {a.stopped}" for a in unrun],
        stack=stack_summary(stack, obs.speculative_enabled, host_workaround(stack)),
        cost=_cost(arms, execution.servers, wall_seconds),
        reproduction=execution.reproduction,
    )


def _row(verdict: Verdict) -> runs.VerdictRow:
    return runs.VerdictRow(
        verdict.cause,
        verdict.status,
        verdict.rationale,
        list(verdict.supports),
        list(verdict.refutes),
        verdict.deciding_probe,
        verdict.basis,
    )


def _cost(
    arms: Mapping[str, ArmState], servers: Mapping[str, Server], wall_seconds: float
) -> RunCost:
    return RunCost(
        requests=sum(len(a.replies) for a in arms.values()),
        wall_seconds=round(wall_seconds, 3),
        server_seconds=round(sum(server_seconds(a) for a in arms.values()), 3),
        launch_seconds=round(sum(s.launch_seconds for s in servers.values()), 3),
    )


def host_workaround(stack: Stack) -> str | None:
    """The host workaround a drill's stack carries (e.g. --no-repack on an AMX host), else
    None: a user's own stack has none, so nothing hides a crash of the user's server."""
    return stack_host_note(stack.source) if stack.source else None
