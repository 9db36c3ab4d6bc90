"""speculative-decoding: a draft model / MTP changes which tokens are committed."""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    removal_verdict,
    reproduces,
)
from triage.plugin_api import Registry

ID = "speculative-decoding"
ARM = "spec-off"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    if not obs.speculative_enabled:
        return Verdict(
            ID,
            "rejected",
            "speculative decoding is not enabled in this stack (no --spec-type / -md flags, "
            "no draft tokens in the replies' timings)",
            deciding_probe="stack",
        )
    base, off = baseline_of(arms), arms.get(ARM)
    planned = ARM in obs.planned or not obs.planned
    gate = arm_gate(
        ID,
        off,
        base,
        reproduces(arms),
        ARM,
        available=planned,
        missing="speculative decoding is on, but the server runs at a URL and "
        "cannot be relaunched without it",
        hint="give [server] binary/model/args instead of url",
    )
    if gate is not None:
        return gate
    assert off is not None
    divergence = ""
    if obs.divergence:
        d = obs.divergence
        divergence = (
            f"; committed streams diverged in {d.get('diverged')}/{d.get('seeds')} fixed seeds"
            + (f" (first at token {min(d['first_positions'])})" if d.get("first_positions") else "")
        )
    return removal_verdict(
        ID,
        off,
        base,
        removes_text="without speculative decoding the failure goes away",
        unchanged_text="the failure rate is unchanged without it",
        note=divergence,
        rejected_note="; speculative decoding preserves the distribution, so committed token "
        "streams may differ without changing how often the request fails",
        supports=("spec-divergence",),
    )


CAUSE = CauseRule(
    id=ID,
    number=1,
    title="Speculative decoding changes the committed tokens",
    mechanism="a draft model / MTP changes which tokens are committed",
    decided_by="the failure rate of a server without the speculative flags",
    rule=rule,
    retrospective="speculative decoding changed which tokens were committed; without it the "
    "request did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
