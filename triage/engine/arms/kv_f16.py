"""kv-f16: the incident's server with an f16 KV cache (`-ctk f16 -ctv f16`), everything else
unchanged. Planned only when the server args quantize the K or V cache.

llama-server b11434 needs flash attention for a quantized V cache: with the default
`-fa auto` it switches flash attention on by itself ("enabling flash_attn since it is
required for quantized V cache"), with `-fa off` it refuses to start. The arm keeps the
incident's `-fa` setting, so an incident that runs quantized-V with flash attention forced
on compares against f16 with flash attention on too: only the cache type changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable
from triage.stackfile import Stack, kv_cache_quantized, kv_cache_types, set_flag

ID = "kv-f16"
CAUSE = "kv-cache-quant"


@dataclass(frozen=True)
class KvF16:
    id: str = ID
    precondition: str = "a quantized KV cache (-ctk / -ctv) in the server args"
    level: str = "server"
    order: int = 65

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or not kv_cache_quantized(server.args):
            return None
        types = kv_cache_types(server.args)
        args = set_flag(server.args, "-ctk", "f16", "--cache-type-k")
        args = set_flag(args, "-ctv", "f16", "--cache-type-v")
        return PlannedArm(
            self.id,
            f"KV cache f16 (was K {types['k']}, V {types['v']})",
            self.level,
            (CAUSE,),
            config=server.with_args(args),
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(KvF16())
