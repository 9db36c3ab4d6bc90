"""reasoning-leak: the thought's markup ends up in content.

The server did not split the thought off: started with `--reasoning-format none` (or
`deepseek-legacy`), a request that sets such a `reasoning_format`, or a build whose parser
does not know the template. The arms that change the reasoning format (server or request)
and the alternate build decide which one is responsible; thinking off also removes the
markup but says nothing about who failed to parse it, so it never confirms this cause.
"""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    baseline_of,
    not_reproduced,
    removes,
    reproduces,
    share,
    suspect,
    unchanged,
)
from triage.engine.arms.reasoning_format import REQUEST_ARM, SERVER_ARM
from triage.plugin_api import Registry

ID = "reasoning-leak"
KIND = "reasoning-markup-in-content"
DECIDING = (SERVER_ARM, REQUEST_ARM, "alt-build")
PROBE = "--reasoning-format auto (server or request) / an alternate build"
WHO = {
    SERVER_ARM: "the server's --reasoning-format",
    REQUEST_ARM: "the request's reasoning_format",
    "alt-build": "the build's reasoning parser",
}


# A hand-written rule, not a declarative `Removal` (triage.causes): several arms, each naming a
# different party (server --reasoning-format, the request's reasoning_format, the build's
# parser): any removing one confirms, all unchanged rejects.
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    if not reproduces(arms):
        return not_reproduced(ID, base, PROBE)
    leak_share = share(base, KIND)
    if leak_share == 0.0:
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies has thought markup in "
            "content: the thought was split off",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    ran = [arms[name] for name in DECIDING if name in arms and arms[name].ran]
    removing = [arm for arm in ran if removes(arm)]
    if removing:
        named = "; ".join(f"{WHO[a.name]} changed: {a.name} {a.kn()}" for a in removing)
        return Verdict(
            ID,
            "confirmed",
            f"{leak_share:.0%} of the failing baseline replies ({base.kn()}) carry thought "
            f"markup in content, and {named} (p={removing[0].p_value:.2g}) removes it",
            supports=["baseline", *[a.name for a in removing]],
            deciding_probe=removing[0].name,
        )
    if ran and all(unchanged(arm) for arm in ran):
        named = "; ".join(f"{a.name} {a.kn()}" for a in ran)
        return Verdict(
            ID,
            "rejected",
            f"thought markup is in content, but changing the reasoning format / build "
            f"leaves the failure unchanged ({named} vs baseline {base.kn()}): the parser "
            "is not responsible (the model writes the markup as text)",
            refutes=[a.name for a in ran],
            deciding_probe=ran[0].name,
        )
    if not ran:
        return suspect(
            ID,
            f"{leak_share:.0%} of the failing replies carry thought markup in content, but "
            "this stack cannot change the reasoning format (not set to none) or the build",
            f"{PROBE} (add [alternates] binary to stack.toml)",
            supports=["baseline"],
            basis="untested",
        )
    return suspect(
        ID,
        "undecided at the cap: " + "; ".join(f"{a.name} {a.kn()}" for a in ran),
        f"{PROBE} with more replays",
        supports=["baseline"],
    )


CAUSE = CauseRule(
    id=ID,
    number=11,
    title="Thought markup leaks into content",
    mechanism="the server did not split the thought off (--reasoning-format none, a "
    "request's reasoning_format, a parser change between builds): <think> / "
    "<|channel>thought markup lands in content",
    decided_by="the server or request with --reasoning-format auto, an alternate build",
    rule=rule,
    retrospective="the model's thinking was returned inside the answer: the server's "
    "reasoning format/parser left the thought markup in content",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
