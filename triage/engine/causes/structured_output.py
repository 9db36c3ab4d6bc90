"""structured-output: response_format / json_schema / grammar together with thinking.

A grammar that does not wrap the thought constrains it from the first token: on a template
that opens the thought in the prompt (Qwen3.5, QwQ, DeepSeek R1 style) the model writes
the JSON inside the open thought and can never close it, so content is empty and
everything lands in reasoning_content (measured on llama-server b11434 with a raw `grammar`;
its own response_format grammars wrap the thought) -- or the server refuses the output
("does not match the expected ... format"). More tokens do not help; removing either half
of the conflict does. Confirmed only when both the request without the structured-output
constraint and the request with thinking off remove the captured failure.
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
from triage.engine.arms.structured_output import ID as ARM
from triage.plugin_api import Registry

ID = "structured-output"
KIND = "structured-output-failed"
PROBE = f"{ARM} + thinking-off"


# A hand-written rule, not a declarative `Removal` (triage.causes): a conjunction of two arms:
# confirmed only when both the unconstrained request and thinking-off remove the failure; either
# unchanged rejects it with its own meaning.
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    plain, off = arms.get(ARM), arms.get("thinking-off")
    if not reproduces(arms):
        return not_reproduced(ID, base, PROBE)
    if share(base, KIND) == 0.0:
        # The check only fires on a constrained request, so this also covers a request
        # without response_format / json_schema / grammar.
        return Verdict(
            ID,
            "rejected",
            f"none of the {base.failures} failing baseline replies lost a structured answer "
            f"(no {KIND}: the request sets no response_format/json_schema/grammar, or the "
            "constraint was met)",
            refutes=["baseline"],
            deciding_probe="baseline",
        )
    if plain is None or not plain.ran:
        why = f"the {ARM} arm did not run" + (f": {plain.error}" if plain and plain.error else "")
        return suspect(ID, why, PROBE, basis="untested")
    if unchanged(plain):
        return Verdict(
            ID,
            "rejected",
            f"without the structured-output constraint the failure rate is unchanged: "
            f"{plain.kn()} vs baseline {base.kn()}",
            refutes=[ARM],
            deciding_probe=ARM,
        )
    if removes(plain) and removes(off):
        assert off is not None
        lifted = arms.get("token-limit-lifted")
        more = (
            f"; max_tokens lifted to the slot's context {lifted.kn()} does not"
            if lifted is not None and unchanged(lifted)
            else ""
        )
        return Verdict(
            ID,
            "confirmed",
            f"the constraint and thinking together fail: baseline {base.kn()}; without the "
            f"constraint {plain.kn()} (p={plain.p_value:.2g}), with thinking off {off.kn()} "
            f"(p={off.p_value:.2g}) both remove it{more}",
            supports=["baseline", ARM, "thinking-off"],
            deciding_probe=ARM,
        )
    if unchanged(off):
        assert off is not None
        return Verdict(
            ID,
            "rejected",
            f"with thinking off the failure rate is unchanged ({off.kn()} vs baseline "
            f"{base.kn()}): thinking is not part of it"
            + (
                f"; without the constraint {plain.kn()}: the grammar/schema itself fails"
                if removes(plain)
                else ""
            ),
            refutes=["thinking-off"],
            deciding_probe="thinking-off",
        )
    return suspect(
        ID,
        f"undecided at the cap: {ARM} {plain.kn()}, thinking-off "
        f"{off.kn() if off is not None else 'not run'}",
        f"{PROBE} with more replays",
    )


CAUSE = CauseRule(
    id=ID,
    number=10,
    title="Structured output (response_format / grammar) conflicts with thinking",
    mechanism="the grammar constrains the thought from the first token: the model can "
    "never close it, so everything lands in reasoning_content (or the server refuses the "
    "output); more tokens do not help",
    decided_by="the request without response_format/grammar, and with thinking off",
    rule=rule,
    retrospective="the request's response_format/grammar and the model's thinking "
    "conflicted: the structured answer was written inside the thought, so content was empty",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
