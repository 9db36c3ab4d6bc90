"""quantized-weights: the weights file (quantization) degrades the output.

When the alternate file has the same quant type, its removing the failure points at the
conversion (`model-file`), not the quantization: this cause then stays suspected."""

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
    removes,
    reproduces,
    suspect,
)
from triage.plugin_api import Registry

ID = "quantized-weights"
ARM = "alt-weights"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, alt = baseline_of(arms), arms.get(ARM)
    gate = arm_gate(
        ID,
        alt,
        base,
        reproduces(arms),
        ARM,
        available=obs.has_alt_weights,
        missing="no alternate weights",
        hint="add [alternates] model to stack.toml",
    )
    if gate is not None:
        return gate
    assert alt is not None
    quants = (obs.facts.get("weights-confounder") or {}).get("quantization")
    same = (
        quants[0]
        if isinstance(quants, list) and len(quants) == 2 and quants[0] == quants[1]
        else None
    )
    if removes(alt) and same:
        return suspect(
            ID,
            f"alternate weights remove the failure ({alt.kn()}), but both files are "
            f"{same}: what differs is the conversion, not the quantization "
            "(see model-file)",
            "alt-weights with another quant type of a known-good conversion",
            supports=[ARM],
        )
    if removes(alt) and obs.confounders:
        return suspect(
            ID,
            f"alternate weights remove the failure ({alt.kn()}), but they also change "
            f"{', '.join(obs.confounders)}: confounded, not attributable to quantization",
            "alt-weights with the same chat template / thinking default",
            supports=[ARM],
        )
    verdict = removal_verdict(
        ID,
        alt,
        base,
        removes_text="alternate weights with the same chat template and thinking default "
        "remove the failure",
        unchanged_text="alternate weights leave the failure rate unchanged",
        supports=("weights-confounder",),
    )
    if verdict.status == "confirmed":
        verdict.rationale += CONFIRMED_LIMIT
    return verdict


# What a confirmation by the weights arm cannot tell apart (issue 24): other weights take
# other kernels, so a swap that happens to avoid a miscompiled kernel looks the same.
CONFIRMED_LIMIT = (
    "; limit: a quant swap that happens to hide a toolchain miscompile (another quant type "
    "runs other CPU/GPU kernels) confirms quantized-weights too -- the cpu-backend and "
    "server-build arms tell them apart"
)


CAUSE = CauseRule(
    id=ID,
    number=2,
    title="The quantized weights file",
    mechanism="the weights (quantization) degrade the output",
    decided_by="alternate weights, with the template/thinking-default confounder ruled out",
    rule=rule,
    retrospective="the quantized weights produced the failing output; other weights did not",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
