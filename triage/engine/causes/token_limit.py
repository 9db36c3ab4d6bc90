"""token-limit: the answer itself does not fit max_tokens."""

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

ID = "token-limit"


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    off, x4 = arms.get("thinking-off"), arms.get("token-limit-x4")
    if not reproduces(arms):
        return not_reproduced(ID, base, "thinking-off + token-limit-x4")
    if base.failures > 0 and share(base, "length-stop") == 0.0:
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies ended with a length stop",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    if removes(off):
        assert off is not None
        return Verdict(
            ID,
            "rejected",
            f"with thinking off the answer fits in the original max_tokens: {off.kn()} "
            "(raising max_tokens is then no evidence for this cause)",
            refutes=["thinking-off"],
            deciding_probe="thinking-off",
        )
    if x4 is None:
        return suspect(
            ID,
            "the request sets no max_tokens, so it cannot be raised",
            "token-limit-x4 (needs max_tokens in the request)",
            basis="untested",
        )
    off_length = off is not None and off.ran and share(off, "length-stop") > 0.5
    if unchanged(off) and off_length and removes(x4):
        assert off is not None
        return Verdict(
            ID,
            "confirmed",
            f"thinking off still fails with length stops ({off.kn()}) while max_tokens x4 "
            f"succeeds ({x4.kn()}, p={x4.p_value:.2g})",
            supports=["thinking-off", "token-limit-x4"],
            deciding_probe="token-limit-x4",
        )
    if unchanged(x4):
        return Verdict(
            ID,
            "rejected",
            f"four times the token limit leaves the failure rate unchanged: {x4.kn()} vs "
            f"baseline {base.kn()}",
            refutes=["token-limit-x4"],
            deciding_probe="token-limit-x4",
        )
    return suspect(
        ID,
        f"undecided: thinking-off {off.kn() if off else 'not run'}, token-limit-x4 {x4.kn()}",
        "thinking-off + token-limit-x4 with more replays",
    )


CAUSE = CauseRule(
    id=ID,
    number=5,
    title="The answer itself does not fit max_tokens",
    mechanism="even without reasoning the answer is longer than max_tokens",
    decided_by="thinking-off still hitting a length stop while max_tokens x4 succeeds",
    rule=rule,
    retrospective="the answer needed more tokens than the request's max_tokens allowed",
)


def register(catalogue: object) -> None:
    catalogue.causes.add(CAUSE)  # type: ignore[attr-defined]
