"""schema-not-enforced: the request asked for a JSON Schema and llama-server's grammar failed
open -- the schema sat in a field llama-server does not read (vLLM's `guided_json`, Ollama's
`format`, `response_format.schema` without type json_object), or a `pattern` its converter
cannot translate was accepted as any string -- so the reply is HTTP 200 with plain text or
JSON that violates the schema (the `schema-violation` finding).

Decided by the `schema-relocated` arm (the same schema where llama-server reads it), planned
only when the schema is in an ignored place: confirmed when the arm removes the violation
and the baseline reproduces it. Rejected when the request sets no schema, or when no failing
reply violates it. A schema already read with a `pattern` the converter does not enforce is
decided by the `schema-simplified` arm (those patterns anchored or dropped, the replies
judged against the original schema): confirmed when it removes the violation of a
reproduced baseline, rejected when it leaves the failure unchanged. Any other violation of a
read schema stays suspected: the grammar was applied, so something else broke the reply.

The incident's server log is evidence in every rationale (triage.engine.server_log): the
"JSON schema conversion was incomplete ... accepting any string" lines written while the
baseline and the deciding arm replayed, per reply where one replay was alone on the
server; "not available" for a server given by URL. When the log shows the simplified arm's
own requests still accepted as any string, the arm tested nothing: suspected, never rejected.
Nor is it rejected when every failing reply of the arm stopped at max_tokens while some of
the baseline's ended on their own with a violating value: the enforced pattern changed the
failure (the model finds no matching value in time), it did not leave it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from triage.causes import (
    BASELINE,
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
    unchanged,
)
from triage.engine.arms.schema import ID as ARM
from triage.engine.arms.schema import SIMPLIFIED
from triage.llama.grammar_log import FACT, arm_evidence
from triage.plugin_api import Registry

ID = "schema-not-enforced"
KIND = "schema-violation"
CUT = "length-stop"  # a reply that stopped at max_tokens


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base, arm = baseline_of(arms), arms.get(ARM)
    if ARM in obs.planned:
        gate = arm_gate(ID, arm, base, reproduces(arms), ARM, available=True, missing="", hint="")
        if gate is not None:
            return gate
        assert arm is not None
        violated = share(base, KIND)
        if violated == 0.0:
            return _satisfied(base)
        log, cited = _log(obs, ARM)
        return removal_verdict(
            ID,
            arm,
            base,
            removes_text="the same JSON schema where llama-server reads it "
            "(response_format.json_schema.schema) is enforced",
            unchanged_text="with the schema where llama-server reads it the replies fail the "
            "same way: its place is not it",
            note=f"; {violated:.0%} of the failing baseline replies violate the schema{log}",
            supports=cited,
        )
    if SIMPLIFIED in obs.planned:
        return _simplified(arms, obs)
    if not reproduces(arms):
        return not_reproduced(ID, base, f"{ARM} (a request whose schema llama-server ignores)")
    if share(base, KIND) == 0.0:
        return _satisfied(base)
    log, cited = _log(obs)
    logged = arm_evidence(obs.facts, BASELINE)
    said = (
        f'; its converter accepted part of the schema as any string ("{logged.text[:200]}"): '
        "a construct this check does not know, which no arm here rewrites"
        if logged is not None and logged.failed_open
        else ": the grammar was applied, something else broke the reply (or a construct this "
        "check does not know)"
    )
    return suspect(
        ID,
        f"{share(base, KIND):.0%} of the failing baseline replies violate the request's JSON "
        "schema, but it is where llama-server reads it and has no pattern its converter is "
        f"known to accept any string for{said}{log}",
        "the server log of a replay ('JSON schema conversion was incomplete', 'failed to "
        "parse grammar') and the schema itself",
        supports=list(cited),
        basis="untested",
    )


def _simplified(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    """The schema-simplified arm decides: its replies are judged against the original
    schema, so a removed violation means the unenforced patterns were what failed open.
    When the server log shows the arm's own requests still accepted as any string, its
    rewrite was not enforced either: it tested nothing, and the cause stays suspected."""
    base, arm = baseline_of(arms), arms.get(SIMPLIFIED)
    gate = arm_gate(
        ID, arm, base, reproduces(arms), SIMPLIFIED, available=True, missing="", hint=""
    )
    if gate is not None:
        return gate
    assert arm is not None
    violated = share(base, KIND)
    if violated == 0.0:
        return _satisfied(base)
    log, cited = _log(obs, SIMPLIFIED)
    own = arm_evidence(obs.facts, SIMPLIFIED)
    if own is not None and own.failed_open:
        return suspect(
            ID,
            f"the {SIMPLIFIED} arm's own requests were logged as accepting any string "
            f"({own.failed_open} lines for {own.replies} replays): this server's converter "
            f"does not enforce the rewritten patterns either, so the arm tested nothing "
            f"({arm.kn()} vs baseline {base.kn()}){log}",
            "a schema whose patterns this server's converter enforces (see its log)",
            supports=list(cited),
        )
    cut = _only_cut(arm, base)
    if cut:
        return suspect(
            ID,
            f"with the patterns enforced every failing {SIMPLIFIED} reply is cut at max_tokens "
            f"({arm.kn()} vs baseline {base.kn()}), while {cut} of the baseline's failing "
            "replies ended on their own with content that violates the schema: the grammar "
            "now holds, but the model does not write a matching value within the limit, so "
            f"the arm's failures are not the baseline's{log}",
            f"{SIMPLIFIED} with a larger max_tokens, or a pattern anchored as the client meant it",
            supports=list(cited),
        )
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text="with the schema's patterns llama-server's grammar converter accepts any "
        "string for anchored (or dropped), the replies follow the client's original schema",
        unchanged_text="with the unenforced patterns anchored (or dropped) the replies still "
        "violate the client's schema: the unenforced pattern is not it",
        note=f"; {violated:.0%} of the failing baseline replies violate the schema{log}",
        supports=cited,
    )


def _only_cut(arm: ArmOutcome, base: ArmOutcome) -> int:
    """An arm left "unchanged" whose failures all stopped at max_tokens, where some of the
    baseline's ended on their own with a violating value, changed the failure (the grammar
    held; the model found no matching value in time): how many baseline failures ended on
    their own, 0 when the arm's outcome stands."""
    if not unchanged(arm) or not arm.failures:
        return 0
    if arm.kind_counts.get(CUT, 0) < arm.failures:
        return 0
    return max(0, base.failures - base.kind_counts.get(CUT, 0))


def _log(obs: Observations, arm: str = "") -> tuple[str, tuple[str, ...]]:
    """What the incident's server log said while the baseline (and `arm`) replayed, for the
    rationale, and the observation it cites ("" and none when the run has no such
    observation: the request asked for no schema)."""
    base = arm_evidence(obs.facts, BASELINE)
    if base is None:
        return "", ()
    if not base.available:
        return f"; {base.sentence}", ()
    parts = [base.sentence]
    other = arm_evidence(obs.facts, arm) if arm else None
    if other is not None and other.sentence:
        parts.append(other.sentence)
    text = "; server log: " + "; ".join(parts)
    if base.text and (base.failed_open or base.refused):
        text += f'; it says: "{base.text[:300]}"'
    return text, (FACT,)


def _satisfied(base: ArmOutcome) -> Verdict:
    return Verdict(
        ID,
        "rejected",
        f"none of the {base.failures} failing baseline replies violates a JSON schema of the "
        f"request (no {KIND}: it sets none, or the content follows it)",
        refutes=["baseline"],
        deciding_probe="baseline",
    )


CAUSE = CauseRule(
    id=ID,
    number=20,
    title="Structured output not enforced (the JSON schema where llama-server ignores it)",
    mechanism="llama-server builds a grammar only from the fields it reads; a schema elsewhere "
    "(guided_json, format, response_format.schema with type text) or a pattern its "
    "converter cannot translate constrains nothing, and the reply is HTTP 200 with plain text "
    "or JSON that violates the schema",
    decided_by="the schema-relocated arm (the same schema in response_format.json_schema) or "
    "the schema-simplified arm (unenforced patterns anchored or dropped, judged against the "
    "original schema)",
    rule=rule,
    retrospective="the request's JSON schema was not enforced: it sat where llama-server "
    "does not read it, or had a pattern its grammar converter accepts any string for; with "
    "the schema in response_format.json_schema, or the pattern anchored, it was enforced",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
