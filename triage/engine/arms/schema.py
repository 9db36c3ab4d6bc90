"""schema-relocated: the failing request with its JSON Schema moved to where llama-server
reads it (`response_format: {type: json_schema, json_schema: {name, schema}}`), the field
it sat in removed. Planned only when the request carries a schema in a place llama-server
ignores (vLLM's `guided_json`, Ollama's `format`, `response_format.schema` without type
json_object; measured on b11434, see triage.llama.schema_fields). Decides
`schema-not-enforced`.
"""

from __future__ import annotations

from kb.jsontypes import JsonObject
from triage.llama.schema_fields import relocated, schema_placement
from triage.probes import RequestArm

ID = "schema-relocated"


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


def register(catalogue: object) -> None:
    catalogue.arms.add(ARM)  # type: ignore[attr-defined]
