"""The gateway arms, planned only when the stack has a `[gateway]` (the URL the client used:
LiteLLM, llama-swap, nginx in front of llama-server). Then the baseline and every other
request-level arm replay through the gateway, as the client's requests went, and:

- `gateway-direct` replays the same request direct to llama-server (`[server].url`),
  bypassing the gateway: the one thing that changes is the gateway. It decides
  `gateway-timeout`.
- `gateway-streamed` replays it through the gateway streamed (SSE): the server sends
  headers and tokens early, which keeps a gateway's read timeout from firing (nginx's
  `proxy_read_timeout` is between two reads). Supporting evidence: where it removes the
  failure, streaming is a workaround that needs no change to the gateway.

The deadline itself (failures that all end at one elapsed time, whatever the content) is
read from the replies' elapsed times by the cause rule (triage/engine/causes/gateway.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.probes import PlannedArm
from triage.stackfile import Stack

DIRECT = "gateway-direct"
STREAMED = "gateway-streamed"
CAUSE = "gateway-timeout"


@dataclass(frozen=True)
class GatewayDirect:
    id: str = DIRECT
    level: str = "request"
    order: int = 80

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if stack.gateway is None:
            return None
        return PlannedArm(
            self.id,
            f"direct to llama-server ({stack.server.url}), bypassing the gateway "
            f"({stack.gateway.url})",
            self.level,
            (CAUSE,),
            copy.deepcopy,
            endpoint="server",
        )


@dataclass(frozen=True)
class GatewayStreamed:
    id: str = STREAMED
    level: str = "request"
    order: int = 81

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        if stack.gateway is None:
            return None
        return PlannedArm(
            self.id,
            "through the gateway, streamed (SSE: headers and tokens sent early)",
            self.level,
            (),
            copy.deepcopy,
            stream=True,
        )


def register(catalogue: object) -> None:
    catalogue.arms.add(GatewayDirect())  # type: ignore[attr-defined]
    catalogue.arms.add(GatewayStreamed())  # type: ignore[attr-defined]
