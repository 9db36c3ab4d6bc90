"""server-flags: how llama-server was launched breaks the requests it gets -- `--no-jinja`
on a server asked for tools (HTTP 500 "tools param requires --jinja flag") or serving a
template its built-in list does not know, an unknown or invalid argument.

Decided by the `jinja-on` server arm (the same server with `--jinja`), planned when the
stack's args switch Jinja off. An unknown flag never gets this far: the engine checks the
args against the binary's own `--help` before launching and names the flag; a server that
exits with an error code at startup is refused with the log line where it did
("error: invalid argument: --foo", "error while handling argument"). Rejected when the
failing replies show no refusal of the server's flags and its args are known and keep
Jinja on; untested when its args are not known (a running server given by URL).
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
    not_reproduced,
    removal_verdict,
    reproduces,
    share,
    suspect,
)
from triage.plugin_api import Registry

ID = "server-flags"
ARM = "jinja-on"
KIND = "server-flag-error"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    refused = share(base, KIND)
    if ARM in obs.planned:
        gate = arm_gate(ID, arm, base, reproduces(arms), ARM, available=True, missing="", hint="")
        if gate is not None:
            return gate
        assert arm is not None
        note = (
            f"; {refused:.0%} of the failing baseline replies are the server refusing its "
            "flags (server-flag-error)"
            if refused
            else ""
        )
        return removal_verdict(
            ID,
            arm,
            base,
            removes_text="the same server with --jinja instead of --no-jinja serves the request",
            unchanged_text="with --jinja the request fails the same way: the Jinja switch is "
            "not it",
            note=note,
        )
    if not reproduces(arms):
        return not_reproduced(ID, base, f"{ARM} (a server whose args switch Jinja off)")
    if refused:
        return suspect(
            ID,
            f"{refused:.0%} of the failing baseline replies are the server refusing the "
            "request for its launch flags (server-flag-error), but this stack cannot "
            "relaunch it with other flags (a running server given by URL)",
            f"{ARM} (give the stack the server's model and args)",
            basis="untested",
        )
    config = obs.facts.get("server-config") or {}
    if not config.get("args_known"):
        return suspect(
            ID,
            "not testable with this stack: the server's launch flags are not known (a "
            "running server given by URL), and no failing reply shows it refusing them",
            f"{ARM} (give the stack the server's model and args)",
            basis="untested",
        )
    return Verdict(
        ID,
        "rejected",
        f"none of the {base.failures} failing baseline replies is the server refusing its "
        "launch flags, and its args keep the Jinja templates on (every flag is one its "
        "--help lists: the engine checked before launching)",
        refutes=["baseline"],
        deciding_probe="baseline",
    )


CAUSE = CauseRule(
    id=ID,
    number=19,
    title="A launch flag of the server breaks the requests (--no-jinja, an invalid argument)",
    mechanism="llama-server launched with --no-jinja refuses tools and unknown templates "
    "(HTTP 500 'tools param requires --jinja flag'); an unknown or invalid argument makes it "
    "exit at startup",
    decided_by="the jinja-on server arm (--jinja instead of --no-jinja); unknown flags are "
    "named before launching from the binary's own --help",
    rule=rule,
    retrospective="the server's launch flags could not serve the requests (--no-jinja with "
    "tools); the same server with --jinja answered them",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
