"""quantized-weights: the weights file (quantization) degrades the output.

When the alternate file has the same quant type, its removing the failure points at the
conversion (`model-file`), not the quantization: this cause then stays suspected."""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Removal, Verdict, removes, suspect
from triage.plugin_api import Registry

ID = "quantized-weights"
ARM = "alt-weights"


def _confounded(ev: Evidence) -> Verdict | None:
    """Alternate weights that remove the failure but change more than the quantization: the
    same quant type (the conversion differs: model-file), or the template / thinking
    default (the weights-confounder observation)."""
    alt, obs = ev.arm, ev.obs
    if not removes(alt):
        return None
    quants = (obs.facts.get("weights-confounder") or {}).get("quantization")
    same = (
        quants[0]
        if isinstance(quants, list) and len(quants) == 2 and quants[0] == quants[1]
        else None
    )
    if same:
        return suspect(
            ID,
            f"alternate weights remove the failure ({alt.kn()}), but both files are "
            f"{same}: what differs is the conversion, not the quantization "
            "(see model-file)",
            "alt-weights with another quant type of a known-good conversion",
            supports=[ARM],
        )
    if obs.confounders:
        return suspect(
            ID,
            f"alternate weights remove the failure ({alt.kn()}), but they also change "
            f"{', '.join(obs.confounders)}: confounded, not attributable to quantization",
            "alt-weights with the same chat template / thinking default",
            supports=[ARM],
        )
    return None


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
    removed_by=(ARM,),
    removal=Removal(
        available=lambda ev: ev.obs.has_alt_weights,
        missing="no alternate weights",
        hint="add [alternates] model to stack.toml",
        arm_check=_confounded,
        removes_text="alternate weights with the same chat template and thinking default "
        "remove the failure",
        unchanged_text="alternate weights leave the failure rate unchanged",
        confirmed_note=CONFIRMED_LIMIT,
        supports=lambda ev: ("weights-confounder",),
    ),
    retrospective="the quantized weights produced the failing output; other weights did not",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
