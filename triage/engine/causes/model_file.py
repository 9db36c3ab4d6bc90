"""model-file: the GGUF conversion of the weights (not their quantization) breaks the output:
a special token stored with the wrong type, a wrong embedded chat template, a wrong
special-token id...

Decided by the alt-weights arm when the alternate file has the SAME quant type as the
incident's (so what differs is the conversion); when the quant types differ the arm decides
`quantized-weights` instead, and this cause stays untested.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    suspect,
)
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


def _conversion_note(obs: Observations) -> str:
    facts: dict[str, Any] = obs.facts.get(CONFOUNDER) or {}
    differs = [str(d) for d in facts.get("conversion_differs") or []]
    differs += [str(d) for d in facts.get("differs") or [] if "template" not in str(d)]
    if differs:
        return "; the files' conversions differ in: " + ", ".join(differs[:6])
    return "; their metadata agrees, so the tensors differ (another conversion/requantization)"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, alt = baseline_of(arms), arms.get(ARM)
    gate = arm_gate(
        ID,
        alt,
        base,
        reproduces(arms),
        ARM,
        available=obs.has_alt_weights,
        missing="no alternate weights file",
        hint="add [alternates] model: the same weights converted again, same quant type",
    )
    if gate is not None:
        return gate
    assert alt is not None
    a, b = quant_types(obs)
    if not same_quant_type(obs):
        return suspect(
            ID,
            f"the alternate file is another quantization ({a or '?'} vs {b or '?'}): the "
            "alt-weights arm tests quantized-weights, and a conversion difference cannot be "
            "told apart from the quantization",
            f"{ARM} with a file of the incident's quant type ({a or 'unknown'})",
            basis="untested",
        )
    return removal_verdict(
        ID,
        alt,
        base,
        removes_text=f"another conversion of the same weights with the same quant type ({a}) "
        "removes the failure",
        unchanged_text=f"another conversion with the same quant type ({a}) leaves the failure "
        "rate unchanged",
        note=_conversion_note(obs),
        supports=(CONFOUNDER,),
    )


CAUSE = CauseRule(
    id=ID,
    number=14,
    title="The GGUF conversion (model file)",
    mechanism="the conversion broke the file's metadata: a special token with the wrong type "
    "(e.g. Gemma 4's <|\"|> as a control token, dropped from the output), a wrong embedded chat "
    "template, wrong special-token ids",
    decided_by="alternate weights of the same quant type (another conversion of the same model)",
    rule=rule,
    retrospective="the GGUF file's conversion was broken; another conversion of the same "
    "weights and quant type did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
