"""jinja-on: the incident's server with `--jinja` instead of `--no-jinja`, everything else
unchanged. Planned only when the stack's args switch the Jinja chat templates off (the last
of `--jinja` / `--no-jinja` wins; b11434's default is on) and the server can be relaunched.
Without Jinja llama-server refuses tools ("tools param requires --jinja flag") and any
template its built-in list does not know ("this custom template is not supported").
"""

from __future__ import annotations

from dataclasses import dataclass

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm, relaunchable
from triage.stackfile import Stack

ID = "jinja-on"
CAUSE = "server-flags"
ON, OFF = "--jinja", "--no-jinja"


def jinja_off(args: tuple[str, ...] | list[str]) -> bool:
    """Do these args switch Jinja off (the last of --jinja / --no-jinja wins)?"""
    flags = [a for a in args if a in (ON, OFF)]
    return bool(flags) and flags[-1] == OFF


@dataclass(frozen=True)
class JinjaOn:
    id: str = ID
    level: str = "server"
    order: int = 66

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        server = stack.server
        if not relaunchable(stack) or not jinja_off(server.args):
            return None
        args = [a for a in server.args if a not in (ON, OFF)] + [ON]
        return PlannedArm(
            self.id,
            "server with --jinja instead of --no-jinja",
            self.level,
            (CAUSE,),
            config=server.with_args(args),
        )


def register(catalogue: Registry) -> None:
    catalogue.arms.add(JinjaOn())
