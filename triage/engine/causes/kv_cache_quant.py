"""kv-cache-quant: a quantized KV cache (`-ctk/-ctv q4_0/q8_0...`) degrades the output
(mojibake, broken JSON, a 500 "does not match the expected ... format").

Decided by the `kv-f16` server arm (the same server with an f16 cache); rejected without a
replay when the stack's server args quantize neither K nor V (there is no quantized cache to
blame); untested for a bare URL stack, whose args (and so its cache type) are not known:
/props does not report the cache type.
"""

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
    suspect,
)
from triage.plugin_api import Registry

ID = "kv-cache-quant"
ARM = "kv-f16"
UNQUANTIZED = ("f16", "f32", "bf16")


def _kv(obs: Observations) -> tuple[bool, dict[str, str]]:
    """(are the incident server's args known, its K/V cache types)."""
    config = obs.facts.get("server-config") or {}
    kv = config.get("kv_cache") or {}
    return bool(config.get("args_known")), {str(k): str(v) for k, v in kv.items()}


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    known, kv = _kv(obs)
    quantized = {part: t for part, t in kv.items() if t not in UNQUANTIZED}
    if ARM not in obs.planned:
        if known and kv and not quantized:
            return Verdict(
                ID,
                "rejected",
                f"the incident's server runs an unquantized KV cache (K {kv.get('k')}, "
                f"V {kv.get('v')}): there is no quantized cache to degrade the output",
                deciding_probe="server args (-ctk/-ctv)",
            )
        return suspect(
            ID,
            "not testable with this stack: the server's KV cache type is not known (a "
            "running server given by URL; /props does not report it)",
            f"{ARM} (give the stack's model and args, with its -ctk/-ctv)",
            basis="untested",
        )
    gate = arm_gate(
        ID,
        arm,
        base,
        reproduces(arms),
        ARM,
        available=True,
        missing="",
        hint="",
    )
    if gate is not None:
        return gate
    assert arm is not None
    was = ", ".join(f"{part.upper()} {t}" for part, t in sorted(quantized.items()))
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text=f"the same server with an f16 KV cache (was {was}) removes the failure",
        unchanged_text=f"an f16 KV cache (was {was}) leaves the failure rate unchanged",
    )


CAUSE = CauseRule(
    id=ID,
    number=7,
    title="The quantized KV cache",
    mechanism="K/V cache quantization (-ctk/-ctv q4_0, q8_0...) loses the precision attention "
    "needs; the output degrades into mojibake, broken JSON or a format the parser rejects",
    decided_by="the kv-f16 server arm (-ctk f16 -ctv f16), when the server quantizes its cache",
    rule=rule,
    retrospective="the server's quantized KV cache degraded the model's output; with an f16 "
    "cache the same requests did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
