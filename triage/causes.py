"""Causes: the protocol a cause implements, and the rules from probe outcomes to a status.

Pure: takes arm outcomes (k/n and the sequential decision against the baseline) and
observations, returns a verdict per catalogue cause with its rationale, the arms whose
evidence moved it, and -- when it stays suspected -- the probe that would decide it.

Every cause, built-in or from a plugin, is a catalogue entry (`catalogue.causes.add(...)`)
implementing `Cause` (= `triage.plugin_api.CauseEntry`); the built-ins live in
`triage/engine/causes/`, one module each.

Statuses follow one rule for every cause:
  confirmed  removing the cause removes the symptom, significantly, and the baseline reproduces;
  rejected   removing it leaves the rate unchanged with enough power to have seen a difference,
             or the cause is structurally absent / contradicted by what the failing replies show;
  suspected  otherwise, including "not testable with this stack" (say which probe decides it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

# The module, not its function: `catalogue()` is read at call time (tests swap it).
import triage.catalogue
from kb.jsontypes import JsonObject
from triage.plugin_api import CauseEntry
from triage.stackfile import Stack, kv_cache_types
from triage.stats import baseline_reproduces, wilson

__all__ = [
    "BASELINE",
    "ArmOutcome",
    "Cause",
    "CauseRule",
    "Evidence",
    "Observations",
    "Removal",
    "ServerConfigFacts",
    "Symptom",
    "Text",
    "Verdict",
    "arm_gate",
    "decide",
    "not_reproduced",
    "removal_rule",
    "removal_verdict",
    "removes",
    "share",
    "suspect",
    "unchanged",
]

BASELINE = "baseline"  # the arm every other arm is compared with (the request as sent)


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
    # Completion tokens of the replies that ended on their own (finish_reason "stop"): the
    # natural length of the answer where no limit cut it.
    ended_tokens: tuple[int, ...] = ()
    # Seconds each reply took (errored replies left out), and those of the failing ones:
    # a deadline shows as failures that all end at one elapsed time.
    elapsed: tuple[float, ...] = ()
    failure_elapsed: tuple[float, ...] = ()

    @property
    def ran(self) -> bool:
        return self.n > 0 and self.decision != "errored"

    def kn(self) -> str:
        ci = wilson(self.failures, self.n)
        return f"{self.failures}/{self.n} (95% CI {ci.low:.2f}-{ci.high:.2f})"


class ServerConfigFacts(TypedDict):
    """The `server-config` fact: what the stack's args say about the incident's server
    (derived by `observations_from`, never stored; a bare URL's args are not known)."""

    name: str
    args_known: bool
    kv_cache: dict[str, str]


@dataclass
class Observations:
    """Facts from non-rate probes. `facts` holds every observation by name (built-in and
    plugin hooks alike); the named fields are the built-in ones the built-in rules read."""

    thinking_on_by_default: bool | None = None  # template render of the request
    deterministic: bool | None = None
    speculative_enabled: bool = False
    divergence: dict[str, Any] | None = None  # {"seeds": s, "diverged": d, "first_positions": []}
    confounders: list[str] = field(default_factory=list)  # what else alt weights change
    has_alt_weights: bool = False
    has_alt_binary: bool = False
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Which arms the plan contained (a cause can tell "not planned" from "did not run").
    planned: tuple[str, ...] = ()
    # The run's stack and failing request when the stack names a server config (not only
    # a URL) and the request is known: for rules that say why an arm was not planned.
    stack: Stack | None = None
    request: JsonObject | None = None


@dataclass
class Verdict:
    cause: str
    status: str
    rationale: str
    supports: list[str] = field(default_factory=list)  # arm/observation names that support
    refutes: list[str] = field(default_factory=list)
    deciding_probe: str = ""
    undecided: str = ""  # when suspected: what would decide it
    # "measured" when arms or observations of this run back it; "untested" when this run
    # could not test the cause at all (the verdict then never overwrites a measured one).
    basis: str = "measured"


# What a cause implements is declared once, in the plugin API (which imports nothing from
# the project, so its `decide` is typed loosely there); `Cause` is the same protocol.
Cause = CauseEntry

Rule = Callable[[Mapping[str, ArmOutcome], Observations], Verdict]


@dataclass(frozen=True)
class Evidence:
    """What a `Removal`'s hooks read: the run's arm outcomes and observations, and the arm
    that removes the cause (an unrun placeholder when the plan did not hold it)."""

    arms: Mapping[str, ArmOutcome]
    obs: Observations
    arm_name: str

    @property
    def base(self) -> ArmOutcome:
        return baseline_of(self.arms)

    @property
    def arm(self) -> ArmOutcome:
        return self.arms.get(self.arm_name) or ArmOutcome(self.arm_name)


# A rationale text: fixed, or worded from the run (e.g. the cache types the arm changed).
Text = str | Callable[[Evidence], str]


@dataclass(frozen=True)
class Symptom:
    """The failure a cause explains shows as one of `kinds` in the failing baseline replies.

    With a symptom the baseline is judged first: a failure that does not reproduce is
    attributed to nothing; one whose failing replies show none of `kinds` (or fewer than
    `min_share` of them, when given) is rejected from the baseline, with `absent` as the
    rationale (`{failures}`: the failing baseline replies; `{share}`: their share showing
    a kind, e.g. `{share:.0%}`)."""

    kinds: tuple[str, ...]
    absent: str
    min_share: float | None = None

    def rejects(self, cause: str, base: ArmOutcome) -> Verdict | None:
        seen = share(base, *self.kinds)
        lacking = seen == 0.0 if self.min_share is None else seen < self.min_share
        if base.failures == 0 or not lacking:
            return None
        return Verdict(
            cause,
            "rejected",
            self.absent.format(failures=base.failures, share=seen),
            refutes=[BASELINE],
            deciding_probe=BASELINE,
        )


@dataclass(frozen=True)
class Removal:
    """How a cause that one arm removes is decided and worded (`CauseRule(removed_by=...)`);
    the shared `removal_rule` decides, in this order:

    1. `symptom`: the baseline first (not reproduced -> not attributed; the failing replies
       lack the symptom -> rejected), see `Symptom`;
    2. `precheck(ev)` may decide before the arm (e.g. "rejected: not in this stack at all");
    3. the arm's gate: `available(ev)` says whether this stack can test it (default: the arm
       is in the plan), else `missing` and `hint` say why not and what would; an arm that
       did not run, or a baseline that does not reproduce, decides nothing;
    4. `arm_check(ev)` may decide once the arm ran (e.g. the arm tested another cause here);
    5. the removal: confirmed (`removes_text`) when the arm removes the failure, rejected
       (`unchanged_text`) when it leaves the rate unchanged, else suspected.

    `note(ev)` is appended to every rationale of step 5 (`confirmed_note` / `rejected_note`
    too, on a confirmation / rejection) and `supports(ev)` names the evidence that backs a
    confirmation beside the arm (listed first unless `supports` places it)."""

    removes_text: Text
    unchanged_text: Text
    missing: Text = ""
    hint: str = ""
    symptom: Symptom | None = None
    precheck: Callable[[Evidence], Verdict | None] | None = None
    available: Callable[[Evidence], bool] | None = None
    arm_check: Callable[[Evidence], Verdict | None] | None = None
    note: Callable[[Evidence], str] | None = None
    confirmed_note: str = ""
    rejected_note: str = ""
    supports: Callable[[Evidence], tuple[str, ...]] | None = None


@dataclass(frozen=True)
class CauseRule:
    """A cause: the shape every built-in cause uses. Either a `rule` function, or
    declaratively "this arm removes it": `removed_by=("arm-id",)` with its `removal` texts
    (see `removal_rule`). The number is declared here, in the cause's own file."""

    id: str
    number: int
    title: str
    mechanism: str
    decided_by: str
    rule: Rule | None = None
    retrospective: str = ""
    when: str = "always"  # or "crash": decided only when the server crashes at startup
    removed_by: tuple[str, ...] = ()
    removal: Removal | None = None

    def __post_init__(self) -> None:
        if self.rule is None and (len(self.removed_by) != 1 or self.removal is None):
            raise ValueError(
                f"cause {self.id!r}: give a `rule`, or `removed_by=(arm,)` with a `removal`"
            )

    def decide(self, arms: Mapping[str, ArmOutcome], observations: Observations) -> Verdict:
        if self.rule is not None:
            return self.rule(arms, observations)
        assert self.removal is not None  # __post_init__
        return removal_rule(self.id, self.removed_by[0], self.removal)(arms, observations)


def _catalogue_causes() -> list[CauseEntry]:
    return list(triage.catalogue.catalogue().causes)


def decide(
    arms: Mapping[str, ArmOutcome], obs: Observations, causes: Iterable[CauseEntry] | None = None
) -> list[Verdict]:
    """Apply every cause's rule (default: the catalogue's causes, by stable number)."""
    chosen = sorted(
        _catalogue_causes() if causes is None else causes, key=lambda cause: int(cause.number)
    )
    verdicts: list[Verdict] = [cause.decide(arms, obs) for cause in chosen]
    return verdicts


# --------------------------------------------------------------------------- helpers
# Shared by the built-in rules and available to plugins.


def baseline_of(arms: Mapping[str, ArmOutcome]) -> ArmOutcome:
    return arms.get(BASELINE) or ArmOutcome(BASELINE)


def reproduces(arms: Mapping[str, ArmOutcome]) -> bool:
    base = baseline_of(arms)
    return baseline_reproduces(base.failures, base.n)


def share(arm: ArmOutcome, *kinds: str) -> float:
    """The largest share of the arm's failing replies that show one of `kinds`."""
    if arm.failures == 0:
        return 0.0
    return max((arm.kind_counts.get(k, 0) for k in kinds), default=0) / arm.failures


def suspect(
    cause: str, why: str, probe: str, *, supports: list[str] | None = None, basis: str = "measured"
) -> Verdict:
    return Verdict(
        cause,
        "suspected",
        why,
        supports=supports or [],
        deciding_probe=probe,
        undecided=f"would be decided by: {probe}",
        basis=basis,
    )


def not_reproduced(cause: str, base: ArmOutcome, probe: str) -> Verdict:
    return suspect(
        cause,
        f"the failure did not reproduce: baseline {base.kn()}; nothing can be attributed "
        "until it does (replay more, or capture the exact failing request)",
        probe,
        basis="untested",
    )


def removes(arm: ArmOutcome | None) -> bool:
    return arm is not None and arm.ran and arm.decision == "removes"


def unchanged(arm: ArmOutcome | None) -> bool:
    return arm is not None and arm.ran and arm.decision == "unchanged"


def arm_gate(
    cause: str,
    arm: ArmOutcome | None,
    base: ArmOutcome,
    is_reproduced: bool,
    name: str,
    *,
    available: bool,
    missing: str,
    hint: str,
) -> Verdict | None:
    """The verdict when an arm cannot decide: not configured, did not run, or the baseline
    does not reproduce. None when the arm's outcome decides."""
    if not available:
        return suspect(
            cause, f"not testable with this stack: {missing}", f"{name} ({hint})", basis="untested"
        )
    if arm is None or not arm.ran:
        return suspect(
            cause, f"the {name} arm did not run: {arm.error if arm else ''}", name, basis="untested"
        )
    if not is_reproduced:
        return not_reproduced(cause, base, name)
    return None


def removal_verdict(
    cause: str,
    arm: ArmOutcome,
    base: ArmOutcome,
    *,
    removes_text: str,
    unchanged_text: str,
    note: str = "",
    confirmed_note: str = "",
    rejected_note: str = "",
    supports: tuple[str, ...] = (),
) -> Verdict:
    """Confirmed when the arm removes the failure, rejected when it leaves it unchanged.
    A confirmation is supported by the arm, then `supports` (unless `supports` names the
    arm: then in that order)."""
    if removes(arm):
        return Verdict(
            cause,
            "confirmed",
            f"{removes_text}: {arm.kn()} vs baseline {base.kn()} (p={arm.p_value:.2g}){note}"
            f"{confirmed_note}",
            supports=list(supports) if arm.name in supports else [arm.name, *supports],
            deciding_probe=arm.name,
        )
    if unchanged(arm):
        return Verdict(
            cause,
            "rejected",
            f"{unchanged_text}: {arm.kn()} vs baseline {base.kn()}{note}{rejected_note}",
            refutes=[arm.name],
            deciding_probe=arm.name,
        )
    return suspect(
        cause, f"undecided at the cap: {arm.name} {arm.kn()}{note}", f"{arm.name} with more replays"
    )


def removal_rule(cause: str, arm_name: str, removal: Removal) -> Rule:
    """The shared rule of a cause one arm removes (the steps are listed on `Removal`)."""

    def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
        ev = Evidence(arms, obs, arm_name)
        base, arm = ev.base, arms.get(arm_name)
        if removal.symptom is not None:
            if not reproduces(arms):
                return not_reproduced(cause, base, arm_name)
            absent = removal.symptom.rejects(cause, base)
            if absent is not None:
                return absent
        early = removal.precheck(ev) if removal.precheck else None
        if early is not None:
            return early
        available = removal.available(ev) if removal.available else arm_name in obs.planned
        gate = arm_gate(
            cause,
            arm,
            base,
            reproduces(arms),
            arm_name,
            available=available,
            missing=_text(removal.missing, ev),
            hint=removal.hint,
        )
        if gate is not None:
            return gate
        assert arm is not None  # the gate passes only an arm that ran
        checked = removal.arm_check(ev) if removal.arm_check else None
        if checked is not None:
            return checked
        return removal_verdict(
            cause,
            arm,
            base,
            removes_text=_text(removal.removes_text, ev),
            unchanged_text=_text(removal.unchanged_text, ev),
            note=removal.note(ev) if removal.note else "",
            confirmed_note=removal.confirmed_note,
            rejected_note=removal.rejected_note,
            supports=removal.supports(ev) if removal.supports else (),
        )

    return rule


def _text(text: Text, ev: Evidence) -> str:
    return text if isinstance(text, str) else text(ev)


def observations_from(
    facts: Mapping[str, dict[str, Any]],
    stack: Stack | None,
    *,
    speculative: bool,
    planned: tuple[str, ...] = (),
    request: JsonObject | None = None,
) -> Observations:
    """The rules' view of a run: the built-in observations read into their fields, every
    observation (plugins' too) kept in `facts`."""
    template = facts.get("template-render", {})
    configured: tuple[Stack, JsonObject] | tuple[None, None] = (None, None)
    if stack is not None and "server-config" not in facts:
        # What the stack says about the incident's server, for rules that need its flags
        # (only flags, never secrets; not stored as evidence). A bare URL has unknown args.
        server = stack.server
        url_only = bool(server.url) and server.model is None
        config: ServerConfigFacts = {
            "name": "server-config",
            "args_known": not url_only,
            "kv_cache": kv_cache_types(tuple(server.args or ())),
        }
        facts = {**facts, "server-config": dict(config)}
        if request is not None:
            configured = (stack, request)
    confounder = facts.get("weights-confounder", {})
    return Observations(
        thinking_on_by_default=template.get("thinking_on"),
        deterministic=facts.get("determinism", {}).get("identical"),
        speculative_enabled=speculative,
        divergence=facts.get("spec-divergence"),
        confounders=list(confounder.get("differs", [])),
        has_alt_weights=stack is not None and stack.alternate_model is not None,
        has_alt_binary=stack is not None and stack.alternate_binary is not None,
        facts=dict(facts),
        planned=planned,
        stack=configured[0],
        request=configured[1],
    )
