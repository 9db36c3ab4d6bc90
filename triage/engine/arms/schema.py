"""schema-relocated and schema-simplified, the arms that decide `schema-not-enforced`.

schema-relocated: the failing request with its JSON Schema moved to where llama-server
reads it (`response_format: {type: json_schema, json_schema: {name, schema}}`), the field
it sat in removed. Planned only when the request carries a schema in a place llama-server
ignores (vLLM's `guided_json`, Ollama's `format`, `response_format.schema` without type
json_object; measured on b11434, see triage.llama.schema_fields).

schema-simplified: the failing request with every `pattern` b11434's converter accepts any
string for (not anchored `^...$`, a `(?...)` group) in the schema it reads rewritten so the
grammar enforces it (anchored, padded with `.*`; `(?:` made a plain group) or, when that is
impossible (a lookaround, inline flags), dropped. The client's schema rides along under
JUDGE_KEY so the replies are judged against it, never the simplified one. Planned only when
the schema llama-server reads has such a pattern.
"""

from __future__ import annotations

from kb.jsontypes import JsonObject
from triage.llama.schema_fields import (
    has_unenforced_pattern,
    relocated,
    schema_placement,
    simplified,
)
from triage.probes import RequestArm

ID = "schema-relocated"
SIMPLIFIED = "schema-simplified"


def schema_unread(request: JsonObject) -> bool:
    """Does the request carry a JSON Schema where llama-server does not read it?"""
    placement = schema_placement(request)
    return placement is not None and not placement.read


ARM = RequestArm(
    ID,
    "the JSON schema moved to response_format.json_schema.schema",
    relocated,
    ("schema-not-enforced",),
    order=52,
    applies=schema_unread,
)


SIMPLIFIED_ARM = RequestArm(
    SIMPLIFIED,
    "the schema's patterns llama-server does not enforce anchored, or dropped "
    "(replies judged against the original schema)",
    simplified,
    ("schema-not-enforced",),
    order=53,
    applies=has_unenforced_pattern,
)


def register(catalogue: object) -> None:
    catalogue.arms.add(ARM)  # type: ignore[attr-defined]
    catalogue.arms.add(SIMPLIFIED_ARM)  # type: ignore[attr-defined]
