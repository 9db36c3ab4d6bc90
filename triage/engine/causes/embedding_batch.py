"""embedding-batch: an `/v1/embeddings` or `/v1/rerank` input longer than llama-server's
physical batch. The server encodes each input in one physical batch and cannot split it
(b11434 splits only when the model has a KV cache and reads its last token: `last` pooling,
a causal reranker; a BERT-family reranker or a mean/cls-pooled embedder is never split):
an input of more tokens than `-ub` (capped by `-b` and the context) is refused with HTTP 500
"input (N tokens) is too large to process. increase the physical batch size" (b11434; the
`embedding-failed` finding), and the whole request fails with it.

Decided by the `ubatch-raised` server arm (the same server with `-ub`/`-b` at least the
longest input's tokens measured by its own `/tokenize`, `-c` raised with them when the slot's
context is smaller), else by the `batch-split` request arm (every input cut to fit the
server's batch): confirmed when an arm removes the failure and the baseline reproduces it,
rejected when the arms that ran leave it unchanged. Rejected without an arm when no failing
reply is an embeddings/rerank failure (a chat completion never meets this limit: its prompt
is split into physical batches), or when the measured longest input fits the batch;
untested when the arms cannot run (a running server given by URL).
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
    removes,
    reproduces,
    share,
    suspect,
)
from triage.engine.arms.embedding_batch import INPUTS, RAISED, SPLIT

ID = "embedding-batch"
KIND = "embedding-failed"


def _measured(obs: Observations) -> str:
    facts = obs.facts.get(INPUTS) or {}
    tokens, batch = facts.get("longest_tokens"), facts.get("physical_batch")
    if isinstance(tokens, int) and isinstance(batch, int):
        return f"; the longest input is {tokens} tokens, the server's physical batch {batch}"
    return ""


def _decide_by(name: str, other: str, arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(name)
    gate = arm_gate(ID, arm, base, reproduces(arms), name, available=True, missing="", hint="")
    if gate is not None:
        return gate
    assert arm is not None
    side = arms.get(other)
    note = _measured(obs)
    if side is not None and side.ran and other in obs.planned:
        note += f"; {other} {side.kn()}"
    if name == RAISED:
        removes_text = (
            "the same server with a physical batch (-ub/-b) that holds the longest input "
            "serves the request"
        )
        unchanged_text = "with -ub/-b raised past the longest input the request fails the same way"
    else:
        removes_text = "the same inputs cut to fit the server's physical batch are served"
        unchanged_text = "with every input cut to fit the physical batch it fails the same way"
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text=removes_text,
        unchanged_text=f"{unchanged_text}: the batch size is not it",
        note=note,
        supports=(other,) if removes(side) else (),
    )


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    refused = share(base, KIND)
    if RAISED in obs.planned:
        return _decide_by(RAISED, SPLIT, arms, obs)
    if SPLIT in obs.planned:
        return _decide_by(SPLIT, RAISED, arms, obs)
    facts = obs.facts.get(INPUTS) or {}
    if not reproduces(arms):
        return not_reproduced(ID, base, f"{RAISED} (an embeddings request the server refused)")
    if refused == 0.0:
        return _absent(base)
    tokens, batch = facts.get("longest_tokens"), facts.get("physical_batch")
    if isinstance(tokens, int) and isinstance(batch, int) and 0 < tokens <= batch:
        return Verdict(
            ID,
            "rejected",
            f"the longest input ({tokens} tokens, measured by the server's /tokenize) fits its "
            f"physical batch ({batch}): the {refused:.0%} of failing replies that are "
            f"embedding-failed are not the batch size",
            refutes=[INPUTS],
            deciding_probe=INPUTS,
        )
    return suspect(
        ID,
        f"{refused:.0%} of the failing baseline replies are embeddings/rerank failures "
        "(embedding-failed), but no arm could vary the physical batch with this stack (a "
        "running server given by URL: its -ub is not known and it cannot be relaunched)",
        f"{RAISED} (give the stack the server's model and args)",
        basis="untested",
    )


def _absent(base: ArmOutcome) -> Verdict:
    return Verdict(
        ID,
        "rejected",
        f"none of the {base.failures} failing baseline replies is an embeddings or rerank "
        f"failure ({KIND}): no input met the physical batch limit (a chat prompt is split "
        "into physical batches, an embeddings input is not)",
        refutes=["baseline"],
        deciding_probe="baseline",
    )


CAUSE = CauseRule(
    id=ID,
    number=23,
    title="An embeddings/rerank input longer than the server's physical batch (-ub)",
    mechanism="llama-server encodes each /v1/embeddings or /v1/rerank input in one physical "
    "batch and cannot split it (unless the model has a KV cache and reads its last token: "
    "last pooling, a causal reranker): an input of more tokens than -ub (capped by -b and -c) is "
    "refused with HTTP 500 'input (N tokens) is too large to process. increase the physical "
    "batch size', failing the whole request",
    decided_by="the ubatch-raised server arm (-ub/-b at least the longest input's measured "
    "tokens, -c raised with them when needed), else the batch-split request arm (inputs cut "
    "to fit the server's batch)",
    rule=rule,
    retrospective="an embeddings input was longer than the server's physical batch (-ub), "
    "which llama-server cannot split; with -ub/-b covering the longest input (or the input "
    "split to fit) the request was served",
)


def register(catalogue: object) -> None:
    catalogue.causes.add(CAUSE)  # type: ignore[attr-defined]
