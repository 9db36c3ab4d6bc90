"""kv-cache-quant: a quantized KV cache (`-ctk/-ctv q4_0/q8_0...`) degrades the output
(mojibake, broken JSON, a 500 "does not match the expected ... format").

Decided by the `kv-f16` server arm (the same server with an f16 cache); rejected without a
replay when the stack's server args quantize neither K nor V (there is no quantized cache to
blame); untested for a bare URL stack, whose args (and so its cache type) are not known:
/props does not report the cache type.
"""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Observations, Removal, Verdict
from triage.plugin_api import Registry

ID = "kv-cache-quant"
ARM = "kv-f16"
UNQUANTIZED = ("f16", "f32", "bf16")


def _kv(obs: Observations) -> tuple[bool, dict[str, str]]:
    """(are the incident server's args known, its K/V cache types)."""
    config = obs.facts.get("server-config") or {}
    kv = config.get("kv_cache") or {}
    return bool(config.get("args_known")), {str(k): str(v) for k, v in kv.items()}


def _quantized(kv: dict[str, str]) -> dict[str, str]:
    return {part: t for part, t in kv.items() if t not in UNQUANTIZED}


def _unquantized(ev: Evidence) -> Verdict | None:
    """Rejected without a replay: the stack's args give the cache types, none quantized."""
    known, kv = _kv(ev.obs)
    if ARM in ev.obs.planned or not (known and kv and not _quantized(kv)):
        return None
    return Verdict(
        ID,
        "rejected",
        f"the incident's server runs an unquantized KV cache (K {kv.get('k')}, "
        f"V {kv.get('v')}): there is no quantized cache to degrade the output",
        deciding_probe="server args (-ctk/-ctv)",
    )


def _was(ev: Evidence) -> str:
    quantized = _quantized(_kv(ev.obs)[1])
    return ", ".join(f"{part.upper()} {t}" for part, t in sorted(quantized.items()))


CAUSE = CauseRule(
    id=ID,
    number=7,
    title="The quantized KV cache",
    mechanism="K/V cache quantization (-ctk/-ctv q4_0, q8_0...) loses the precision attention "
    "needs; the output degrades into mojibake, broken JSON or a format the parser rejects",
    decided_by="the kv-f16 server arm (-ctk f16 -ctv f16), when the server quantizes its cache",
    removed_by=(ARM,),
    removal=Removal(
        precheck=_unquantized,
        missing="the server's KV cache type is not known (a running server given by URL; "
        "/props does not report it)",
        hint="give the stack's model and args, with its -ctk/-ctv",
        removes_text=lambda ev: (
            f"the same server with an f16 KV cache (was {_was(ev)}) removes the failure"
        ),
        unchanged_text=lambda ev: (
            f"an f16 KV cache (was {_was(ev)}) leaves the failure rate unchanged"
        ),
    ),
    retrospective="the server's quantized KV cache degraded the model's output; with an f16 "
    "cache the same requests did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
