"""output-parsing: output lands in the wrong field or fails to parse."""

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
)
from triage.plugin_api import Registry

ID = "output-parsing"
PARSE_KINDS = (
    "tool-markup-leaked",
    "parse-failure",
    "tool-args-invalid-json",
    "tool-args-schema-violation",
)


# A hand-written rule, not a declarative `Removal` (triage.causes): no arm of its own removes
# it: the raw text (verbose) of the failing baseline replies decides it, and thinking-off only
# moves the output (it confirms only beside the parse findings).
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    if not reproduces(arms):
        return not_reproduced(ID, base, "baseline (verbose raw text)")
    parse_share = share(base, *PARSE_KINDS)
    if share(base, "server-crash") == 1.0:
        return Verdict(
            ID,
            "rejected",
            f"all {base.failures} failing baseline replays are "
            "server crashes: there was no output to parse",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    if parse_share == 0:
        why = f"all {base.failures} failing baseline replies parsed cleanly"
        if share(base, "length-stop") == 1.0 and base.raw_misplaced == 0:
            empty = base.kind_counts.get("empty-content", 0)
            if empty == base.failures:
                why += (
                    "; they are length stops with empty content, and their raw text holds "
                    "no answer or tool call outside the thought: the answer was never "
                    "produced, so there was nothing to misplace"
                )
            else:
                why += (
                    f"; they are length stops (cut at the token limit), {base.failures - empty}"
                    f" of them with content in the content field, and the raw text holds "
                    "nothing the parsed response lost or misplaced"
                )
        return Verdict(ID, "rejected", why, refutes=["baseline"], deciding_probe="baseline")
    off = arms.get("thinking-off")
    if removes(off) and share(base, "length-stop") < 0.5:
        assert off is not None
        return Verdict(
            ID,
            "confirmed",
            f"{parse_share:.0%} of failing replies show tool-call markup in the wrong field or "
            f"unparsable output, and moving the output out of the thought removes it: "
            f"thinking-off {off.kn()} (p={off.p_value:.2g})",
            supports=["baseline", "thinking-off"],
            deciding_probe="thinking-off",
        )
    if base.raw_misplaced >= 2 and share(base, "length-stop") < 0.5:
        return Verdict(
            ID,
            "confirmed",
            f"in {base.raw_misplaced} failing replies the raw text (verbose) holds the output "
            "that the parsed response lost or misplaced",
            supports=["baseline"],
            deciding_probe="baseline",
        )
    return suspect(
        ID,
        f"{parse_share:.0%} of failing replies show parse-related findings, but no arm "
        "moved the output or removed the failure",
        "reasoning_format none / an alternate build",
        supports=["baseline"],
    )


CAUSE = CauseRule(
    id=ID,
    number=4,
    title="Output lands in the wrong field or fails to parse",
    mechanism="tool-call markup in reasoning_content or content, a peg-format 500, "
    "arguments that are not JSON",
    decided_by="the raw text (verbose) and the arms that move where the output goes",
    rule=rule,
    retrospective="the server's output parser put the model's answer or tool call in the "
    "wrong field, or could not parse it",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
