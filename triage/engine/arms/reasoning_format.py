"""reasoning-format arms: let the server split the thought off again.

* `server-reasoning-format` (server level): the incident's server relaunched with
  `--reasoning-format auto`; planned only when its args set a format that leaves thought
  markup in content (`none`, `deepseek-legacy`).
* `request-reasoning-format` (request level): the request's own `reasoning_format` field
  (llama-server honours it per request) set to `auto`; planned only when the request sets a
  leaking one.

With the alternate-build arm (a parser change between builds) they decide
`reasoning-leak`: which of the server's format, the request's or the build leaves the
thought in content.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, RequestArm, relaunchable
from triage.stackfile import Stack, set_flag

SERVER_ARM = "server-reasoning-format"
REQUEST_ARM = "request-reasoning-format"
# Formats that keep the thought's tags in message.content.
LEAKING_FORMATS = frozenset({"none", "deepseek-legacy"})
DECIDES = ("reasoning-leak",)


def server_reasoning_format(args: tuple[str, ...] | list[str]) -> str | None:
    """The `--reasoning-format` value in a server's args (None when unset: auto)."""
    value = None
    for index, arg in enumerate(args):
        if arg == "--reasoning-format" and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith("--reasoning-format="):
            value = arg.split("=", 1)[1]
    return value


def request_leaks(request: JsonObject) -> bool:
    return request.get("reasoning_format") in LEAKING_FORMATS


def reasoning_format_auto(request: JsonObject) -> JsonObject:
    body = copy.deepcopy(request)
    body["reasoning_format"] = "auto"
    return body


@dataclass(frozen=True)
class ServerReasoningFormat:
    id: str = SERVER_ARM
    precondition: str = "a --reasoning-format that leaks the thought into content"
    level: str = "server"
    order: int = 85

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        current = server_reasoning_format(server.args)
        if not relaunchable(stack) or current not in LEAKING_FORMATS:
            return None
        return PlannedArm(
            self.id,
            f"server started with --reasoning-format auto (was {current})",
            self.level,
            DECIDES,
            config=server.with_args(set_flag(server.args, "--reasoning-format", "auto")),
        )


REQUEST = RequestArm(
    REQUEST_ARM,
    "request reasoning_format = auto",
    reasoning_format_auto,
    DECIDES,
    order=55,
    applies=request_leaks,
    precondition="a reasoning_format in the request that leaks the thought into content",
)


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ServerReasoningFormat())
    catalogue.arms.add(REQUEST)
