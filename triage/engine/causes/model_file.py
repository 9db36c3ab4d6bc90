"""model-file: the GGUF conversion of the weights (not their quantization) breaks the output:
a special token stored with the wrong type, a wrong embedded chat template, a wrong
special-token id...

Decided by the alt-weights arm when the alternate file has the SAME quant type as the
incident's (so what differs is the conversion); when the quant types differ the arm decides
`quantized-weights` instead, and this cause stays untested.
"""

from __future__ import annotations

from typing import Any

from triage.causes import CauseRule, Evidence, Observations, Removal, Verdict, suspect
from triage.plugin_api import Registry

ID = "model-file"
ARM = "alt-weights"
CONFOUNDER = "weights-confounder"


def quant_types(obs: Observations) -> tuple[str | None, str | None]:
    """(incident's, alternate's) quantization from the weights-confounder observation."""
    facts: dict[str, Any] = obs.facts.get(CONFOUNDER) or {}
    quants = facts.get("quantization")
    if isinstance(quants, (list, tuple)) and len(quants) == 2:
        a, b = quants
        return (str(a) if a else None), (str(b) if b else None)
    return None, None


def same_quant_type(obs: Observations) -> bool:
    a, b = quant_types(obs)
    return a is not None and a == b


def _conversion_note(ev: Evidence) -> str:
    facts: dict[str, Any] = ev.obs.facts.get(CONFOUNDER) or {}
    differs = [str(d) for d in facts.get("conversion_differs") or []]
    differs += [str(d) for d in facts.get("differs") or [] if "template" not in str(d)]
    if differs:
        return "; the files' conversions differ in: " + ", ".join(differs[:6])
    return "; their metadata agrees, so the tensors differ (another conversion/requantization)"


def _other_quant_type(ev: Evidence) -> Verdict | None:
    """Another quant type: the alt-weights arm tests quantized-weights, not the conversion."""
    if same_quant_type(ev.obs):
        return None
    a, b = quant_types(ev.obs)
    return suspect(
        ID,
        f"the alternate file is another quantization ({a or '?'} vs {b or '?'}): the "
        "alt-weights arm tests quantized-weights, and a conversion difference cannot be "
        "told apart from the quantization",
        f"{ARM} with a file of the incident's quant type ({a or 'unknown'})",
        basis="untested",
    )


def _quant(ev: Evidence) -> str | None:
    return quant_types(ev.obs)[0]


CAUSE = CauseRule(
    id=ID,
    number=14,
    title="The GGUF conversion (model file)",
    mechanism="the conversion broke the file's metadata: a special token with the wrong type "
    "(e.g. Gemma 4's <|\"|> as a control token, dropped from the output), a wrong embedded chat "
    "template, wrong special-token ids",
    decided_by="alternate weights of the same quant type (another conversion of the same model)",
    removed_by=(ARM,),
    removal=Removal(
        available=lambda ev: ev.obs.has_alt_weights,
        missing="no alternate weights file",
        hint="add [alternates] model: the same weights converted again, same quant type",
        arm_check=_other_quant_type,
        removes_text=lambda ev: (
            "another conversion of the same weights with the same quant "
            f"type ({_quant(ev)}) removes the failure"
        ),
        unchanged_text=lambda ev: (
            f"another conversion with the same quant type ({_quant(ev)}) "
            "leaves the failure rate unchanged"
        ),
        note=_conversion_note,
        supports=lambda ev: (CONFOUNDER,),
    ),
    retrospective="the GGUF file's conversion was broken; another conversion of the same "
    "weights and quant type did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
