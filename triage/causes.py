"""The cause catalogue and the rules from probe outcomes to a status.

Pure: takes arm outcomes (k/n and the sequential decision against the baseline) and
observations, returns a verdict per catalogue cause with its rationale, the arms whose
evidence moved it, and -- when it stays suspected -- the probe that would decide it.

Statuses follow one rule for every cause:
  confirmed  removing the cause removes the symptom, significantly, and the baseline reproduces;
  rejected   removing it leaves the rate unchanged with enough power to have seen a difference,
             or the cause is structurally absent / contradicted by what the failing replies show;
  suspected  otherwise, including "not testable with this stack" (say which probe decides it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triage.stats import baseline_reproduces, wilson

CATALOGUE: dict[str, dict[str, str]] = {
    "reasoning-exhausts-budget": {
        "title": "Reasoning channel exhausts the completion budget",
        "mechanism": "thinking is on and the thought eats max_tokens, so content is empty or cut",
        "decided_by": "thinking-off / reasoning-budget at the original max_tokens",
    },
    "token-limit": {
        "title": "The answer itself does not fit max_tokens",
        "mechanism": "even without reasoning the answer is longer than max_tokens",
        "decided_by": "thinking-off still hitting a length stop while max_tokens x4 succeeds",
    },
    "quantized-weights": {
        "title": "The quantized weights file",
        "mechanism": "the weights (quantization) degrade the output",
        "decided_by": "alternate weights, with the template/thinking-default confounder ruled out",
    },
    "speculative-decoding": {
        "title": "Speculative decoding changes the committed tokens",
        "mechanism": "a draft model / MTP changes which tokens are committed",
        "decided_by": "the failure rate of a server without the speculative flags",
    },
    "output-parsing": {
        "title": "Output lands in the wrong field or fails to parse",
        "mechanism": "tool-call markup in reasoning_content or content, a peg-format 500, "
        "arguments that are not JSON",
        "decided_by": "the raw text (verbose) and the arms that move where the output goes",
    },
    "server-build": {
        "title": "The llama-server build",
        "mechanism": "a regression in the server build (chat parser, sampling, kernels)",
        "decided_by": "an alternate llama-server binary",
    },
}

PARSE_KINDS = (
    "tool-markup-leaked",
    "parse-failure",
    "tool-args-invalid-json",
    "tool-args-schema-violation",
)


@dataclass
class ArmOutcome:
    """One arm as the rules see it."""

    name: str
    n: int = 0
    failures: int = 0
    decision: str = "not-run"  # removes | unchanged | undecided | no-baseline-failure | errored
    p_value: float | None = None
    kind_counts: dict[str, int] = field(default_factory=dict)  # over failing replies
    raw_misplaced: int = 0  # failing replies whose raw text holds output the parse lost
    error: str = ""

    @property
    def ran(self) -> bool:
        return self.n > 0 and self.decision != "errored"

    def kn(self) -> str:
        ci = wilson(self.failures, self.n)
        return f"{self.failures}/{self.n} (95% CI {ci.low:.2f}-{ci.high:.2f})"


@dataclass
class Observations:
    """Facts from non-rate probes."""

    thinking_on_by_default: bool | None = None  # template render of the request
    deterministic: bool | None = None
    speculative_enabled: bool = False
    divergence: dict[str, Any] | None = None  # {"seeds": s, "diverged": d, "first_positions": []}
    confounders: list[str] = field(default_factory=list)  # what else alt weights change
    has_alt_weights: bool = False
    has_alt_binary: bool = False


@dataclass
class Verdict:
    cause: str
    status: str
    rationale: str
    supports: list[str] = field(default_factory=list)  # arm names whose evidence supports
    refutes: list[str] = field(default_factory=list)
    deciding_probe: str = ""
    undecided: str = ""  # when suspected: what would decide it

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.cause,
            "status": self.status,
            "rationale": self.rationale,
            "supports": self.supports,
            "refutes": self.refutes,
            "deciding_probe": self.deciding_probe,
            "undecided": self.undecided,
        }


def _share(arm: ArmOutcome, *kinds: str) -> float:
    if arm.failures == 0:
        return 0.0
    return max((arm.kind_counts.get(k, 0) for k in kinds), default=0) / arm.failures


def _suspect(cause: str, why: str, probe: str, *, supports: list[str] | None = None) -> Verdict:
    return Verdict(cause, "suspected", why, supports=supports or [], deciding_probe=probe,
                   undecided=f"would be decided by: {probe}")


def decide(arms: dict[str, ArmOutcome], obs: Observations) -> list[Verdict]:
    """Apply the rules to every catalogue cause."""
    base = arms.get("baseline", ArmOutcome("baseline"))
    reproduces = baseline_reproduces(base.failures, base.n)
    verdicts = [
        _reasoning(arms, base, reproduces, obs),
        _token_limit(arms, base, reproduces),
        _weights(arms, reproduces, obs),
        _speculative(arms, reproduces, obs),
        _parsing(arms, base, reproduces),
        _build(arms, reproduces, obs),
    ]
    return verdicts


def _not_reproduced(cause: str, base: ArmOutcome, probe: str) -> Verdict:
    return _suspect(
        cause,
        f"the failure did not reproduce: baseline {base.kn()}; nothing can be attributed "
        "until it does (replay more, or capture the exact failing request)",
        probe,
    )


def _removes(arm: ArmOutcome | None) -> bool:
    return arm is not None and arm.ran and arm.decision == "removes"


def _unchanged(arm: ArmOutcome | None) -> bool:
    return arm is not None and arm.ran and arm.decision == "unchanged"


def _reasoning(
    arms: dict[str, ArmOutcome], base: ArmOutcome, reproduces: bool, obs: Observations
) -> Verdict:
    cause = "reasoning-exhausts-budget"
    off, budget, server_off = (
        arms.get("thinking-off"), arms.get("reasoning-budget"), arms.get("server-reasoning-off")
    )
    if not reproduces:
        return _not_reproduced(cause, base, "thinking-off")
    length_share = _share(base, "length-stop")
    if length_share == 0.0 and base.failures > 0:
        return Verdict(
            cause, "rejected",
            f"none of the {base.failures} failing baseline replies ended with a length stop; "
            "a stop that is not a length stop rules out budget exhaustion",
            refutes=["baseline"], deciding_probe="baseline",
        )
    removing = [a for a in (off, budget, server_off) if _removes(a)]
    if removing:
        named = "; ".join(f"{a.name} {a.kn()}" for a in removing)
        return Verdict(
            cause, "confirmed",
            f"baseline fails {base.kn()}, {length_share:.0%} of failures are length stops; "
            f"with the reasoning channel removed or bounded at the original max_tokens: {named} "
            f"(p={removing[0].p_value:.2g})"
            + (", thinking is on by default for this request (template render)"
               if obs.thinking_on_by_default else ""),
            supports=["baseline", *[a.name for a in removing]],
            deciding_probe=removing[0].name,
        )
    if obs.thinking_on_by_default is False and _share(base, "reasoning-exhausted-budget") == 0:
        return Verdict(
            cause, "rejected",
            "thinking is off for this request (template render) and no failing reply shows "
            "reasoning filling the budget",
            refutes=["template-render"], deciding_probe="template-render",
        )
    if _unchanged(off) and (budget is None or not budget.ran or _unchanged(budget)):
        return Verdict(
            cause, "rejected",
            f"thinking off leaves the failure rate unchanged: {off.kn()} vs baseline {base.kn()}"
            + (f"; reasoning budget {budget.kn()}" if budget and budget.ran else ""),
            refutes=["thinking-off"] + (["reasoning-budget"] if budget and budget.ran else []),
            deciding_probe="thinking-off",
        )
    return _suspect(cause, f"undecided at the cap: thinking-off {off.kn() if off else 'not run'}",
                    "thinking-off with more replays (--max-requests)")


def _token_limit(arms: dict[str, ArmOutcome], base: ArmOutcome, reproduces: bool) -> Verdict:
    cause = "token-limit"
    off, x4 = arms.get("thinking-off"), arms.get("token-limit-x4")
    if not reproduces:
        return _not_reproduced(cause, base, "thinking-off + token-limit-x4")
    if base.failures > 0 and _share(base, "length-stop") == 0.0:
        return Verdict(
            cause, "rejected",
            f"none of the {base.failures} failing baseline replies ended with a length stop",
            refutes=["baseline"], deciding_probe="baseline",
        )
    if _removes(off):
        return Verdict(
            cause, "rejected",
            f"with thinking off the answer fits in the original max_tokens: {off.kn()} "
            "(raising max_tokens is then no evidence for this cause)",
            refutes=["thinking-off"], deciding_probe="thinking-off",
        )
    if x4 is None:
        return _suspect(cause, "the request sets no max_tokens, so it cannot be raised",
                        "token-limit-x4 (needs max_tokens in the request)")
    off_length = off is not None and off.ran and _share(off, "length-stop") > 0.5
    if _unchanged(off) and off_length and _removes(x4):
        return Verdict(
            cause, "confirmed",
            f"thinking off still fails with length stops ({off.kn()}) while max_tokens x4 "
            f"succeeds ({x4.kn()}, p={x4.p_value:.2g})",
            supports=["thinking-off", "token-limit-x4"], deciding_probe="token-limit-x4",
        )
    if _unchanged(x4):
        return Verdict(
            cause, "rejected",
            f"four times the token limit leaves the failure rate unchanged: {x4.kn()} vs "
            f"baseline {base.kn()}",
            refutes=["token-limit-x4"], deciding_probe="token-limit-x4",
        )
    return _suspect(cause, f"undecided: thinking-off {off.kn() if off else 'not run'}, "
                    f"token-limit-x4 {x4.kn()}", "thinking-off + token-limit-x4 with more replays")


def _arm_gate(cause: str, arm: ArmOutcome | None, base: ArmOutcome, reproduces: bool,
              name: str, *, available: bool, missing: str, hint: str) -> Verdict | None:
    """The verdict when a server-level arm cannot decide: not configured, did not run, or the
    baseline does not reproduce. None when the arm's outcome decides."""
    if not available:
        return _suspect(cause, f"not testable with this stack: {missing}", f"{name} ({hint})")
    if arm is None or not arm.ran:
        return _suspect(cause, f"the {name} arm did not run: {arm.error if arm else ''}", name)
    if not reproduces:
        return _not_reproduced(cause, base, name)
    return None


def _removal_verdict(cause: str, arm: ArmOutcome, base: ArmOutcome, *, removes: str,
                     unchanged: str, note: str = "", rejected_note: str = "",
                     supports: tuple[str, ...] = ()) -> Verdict:
    """Confirmed when the arm removes the failure, rejected when it leaves it unchanged."""
    if _removes(arm):
        return Verdict(
            cause, "confirmed",
            f"{removes}: {arm.kn()} vs baseline {base.kn()} (p={arm.p_value:.2g}){note}",
            supports=[arm.name, *supports], deciding_probe=arm.name,
        )
    if _unchanged(arm):
        return Verdict(
            cause, "rejected",
            f"{unchanged}: {arm.kn()} vs baseline {base.kn()}{note}{rejected_note}",
            refutes=[arm.name], deciding_probe=arm.name,
        )
    return _suspect(cause, f"undecided at the cap: {arm.name} {arm.kn()}{note}",
                    f"{arm.name} with more replays")


def _weights(arms: dict[str, ArmOutcome], reproduces: bool, obs: Observations) -> Verdict:
    cause, base, alt = "quantized-weights", arms["baseline"], arms.get("alt-weights")
    gate = _arm_gate(cause, alt, base, reproduces, "alt-weights",
                     available=obs.has_alt_weights, missing="no alternate weights",
                     hint="add [alternates] model to stack.toml")
    if gate is not None:
        return gate
    assert alt is not None
    if _removes(alt) and obs.confounders:
        return _suspect(
            cause,
            f"alternate weights remove the failure ({alt.kn()}), but they also change "
            f"{', '.join(obs.confounders)}: confounded, not attributable to quantization",
            "alt-weights with the same chat template / thinking default",
            supports=["alt-weights"],
        )
    return _removal_verdict(
        cause, alt, base,
        removes="alternate weights with the same chat template and thinking default remove "
        "the failure",
        unchanged="alternate weights leave the failure rate unchanged",
        supports=("weights-confounder",),
    )


def _speculative(arms: dict[str, ArmOutcome], reproduces: bool, obs: Observations) -> Verdict:
    cause = "speculative-decoding"
    if not obs.speculative_enabled:
        return Verdict(
            cause, "rejected",
            "speculative decoding is not enabled in this stack (no --spec-type / -md flags)",
            deciding_probe="stack",
        )
    base, off = arms["baseline"], arms.get("spec-off")
    gate = _arm_gate(cause, off, base, reproduces, "spec-off", available=True, missing="",
                     hint="")
    if gate is not None:
        return gate
    assert off is not None
    divergence = ""
    if obs.divergence:
        d = obs.divergence
        divergence = (
            f"; committed streams diverged in {d.get('diverged')}/{d.get('seeds')} fixed seeds"
            + (f" (first at token {min(d['first_positions'])})" if d.get("first_positions")
               else "")
        )
    return _removal_verdict(
        cause, off, base,
        removes="without speculative decoding the failure goes away",
        unchanged="the failure rate is unchanged without it",
        note=divergence,
        rejected_note="; speculative decoding preserves the distribution, so committed token "
        "streams may differ without changing how often the request fails",
        supports=("spec-divergence",),
    )


def _parsing(arms: dict[str, ArmOutcome], base: ArmOutcome, reproduces: bool) -> Verdict:
    cause = "output-parsing"
    if not reproduces:
        return _not_reproduced(cause, base, "baseline (verbose raw text)")
    parse_share = _share(base, *PARSE_KINDS)
    if parse_share == 0:
        why = f"all {base.failures} failing baseline replies parsed cleanly"
        if _share(base, "length-stop") == 1.0 and base.raw_misplaced == 0:
            why += ("; they are length stops whose raw text holds no answer or tool call "
                    "outside the thought: the output was never produced")
        return Verdict(cause, "rejected", why, refutes=["baseline"], deciding_probe="baseline")
    off = arms.get("thinking-off")
    if _removes(off) and _share(base, "length-stop") < 0.5:
        return Verdict(
            cause, "confirmed",
            f"{parse_share:.0%} of failing replies show tool-call markup in the wrong field or "
            f"unparsable output, and moving the output out of the thought removes it: "
            f"thinking-off {off.kn()} (p={off.p_value:.2g})",
            supports=["baseline", "thinking-off"], deciding_probe="thinking-off",
        )
    if base.raw_misplaced >= 2 and _share(base, "length-stop") < 0.5:
        return Verdict(
            cause, "confirmed",
            f"in {base.raw_misplaced} failing replies the raw text (verbose) holds the output "
            "that the parsed response lost or misplaced",
            supports=["baseline"], deciding_probe="baseline",
        )
    return _suspect(
        cause,
        f"{parse_share:.0%} of failing replies show parse-related findings, but no arm "
        "moved the output or removed the failure",
        "reasoning_format none / an alternate build",
        supports=["baseline"],
    )


def _build(arms: dict[str, ArmOutcome], reproduces: bool, obs: Observations) -> Verdict:
    cause, base, alt = "server-build", arms["baseline"], arms.get("alt-build")
    gate = _arm_gate(cause, alt, base, reproduces, "alt-build",
                     available=obs.has_alt_binary, missing="no alternate llama-server binary",
                     hint="add [alternates] binary to stack.toml")
    if gate is not None:
        return gate
    assert alt is not None
    return _removal_verdict(
        cause, alt, base,
        removes="the alternate build removes the failure",
        unchanged="the alternate build leaves the failure rate unchanged",
    )
