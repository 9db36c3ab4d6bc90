"""schema-not-enforced: the request asked for a JSON Schema and llama-server's grammar failed
open -- the schema sat in a field llama-server does not read (vLLM's `guided_json`, Ollama's
`format`, `response_format.schema` without type json_object), or a `pattern` its converter
cannot translate was accepted as any string -- so the reply is HTTP 200 with plain text or
JSON that violates the schema (the `schema-violation` finding).

Decided by the `schema-relocated` arm (the same schema where llama-server reads it), planned
only when the schema is in an ignored place: confirmed when the arm removes the violation
and the baseline reproduces it. Rejected when the request sets no schema, or when no failing
reply violates it. A schema already read whose violated `pattern`s the converter does not
enforce is suspected (no arm rewrites patterns yet); any other violation of a read schema
stays suspected: the grammar was applied, so something else broke the reply.
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
from triage.engine.arms.schema import ID as ARM
from triage.plugin_api import Registry

ID = "schema-not-enforced"
KIND = "schema-violation"


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
        return removal_verdict(
            ID,
            arm,
            base,
            removes_text="the same JSON schema where llama-server reads it "
            "(response_format.json_schema.schema) is enforced",
            unchanged_text="with the schema where llama-server reads it the replies fail the "
            "same way: its place is not it",
            note=f"; {violated:.0%} of the failing baseline replies violate the schema",
        )
    if not reproduces(arms):
        return not_reproduced(ID, base, f"{ARM} (a request whose schema llama-server ignores)")
    if share(base, KIND) == 0.0:
        return _satisfied(base)
    return suspect(
        ID,
        f"{share(base, KIND):.0%} of the failing baseline replies violate the request's JSON "
        "schema, but it is where llama-server reads it: either a construct its converter "
        "accepts any string for (a `pattern`; 'JSON schema conversion was incomplete' in the "
        "server log) or something else broke the reply",
        "a schema-simplified arm (not built: remove the unenforced pattern and compare)",
        basis="untested",
    )


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
    decided_by="the schema-relocated arm (the same schema in response_format.json_schema)",
    rule=rule,
    retrospective="the request's JSON schema sat where llama-server does not read it, so "
    "nothing constrained the reply; the same schema in response_format.json_schema was "
    "enforced",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
