"""Where llama-server reads a request's JSON Schema, and what its grammar converter drops.

Measured on b11434 (/v1/chat/completions, a model that answers plain text unless a grammar
constrains it): the schema is turned into a grammar from `response_format: {type:
json_schema, json_schema: {schema}}`, `response_format: {type: json_object, schema}` and a
top-level `json_schema` (`response_format: {type: json_schema}` with the schema one level
off still gets an any-object grammar). It is NOT read -- the reply is plain text with HTTP
200 -- from vLLM's `guided_json`, Ollama's `format`, or `response_format.schema` whose type
is `text` or absent. A `pattern` the converter cannot translate (not anchored with `^` and
`$`, a `(?...)` group) is logged as "JSON schema conversion was incomplete: pattern ... is
not supported ..., accepting any string" and not enforced.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kb.jsontypes import JsonObject

# Fields other servers read that llama-server ignores (request path, label).
IGNORED_FIELDS = (("guided_json", "vLLM's guided_json"), ("format", "Ollama's format"))
READ_PLACE = "$.request.response_format.json_schema.schema"
MAX_SCHEMA_NODES = 10_000  # bound on the walk over a schema for unsupported patterns


@dataclass(frozen=True)
class Placement:
    """Where the request carries its schema and whether llama-server reads it there."""

    where: str
    schema: dict[str, Any]
    read: bool
    label: str = ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def schema_placement(request: JsonObject) -> Placement | None:
    """The schema the request carries (where the client put it), None when it sets none."""
    response_format = _dict(request.get("response_format"))
    kind = response_format.get("type")
    inner = _dict(response_format.get("json_schema"))
    if kind == "json_schema" and isinstance(inner.get("schema"), dict):
        return Placement(READ_PLACE, inner["schema"], True)
    if isinstance(response_format.get("schema"), dict):
        read = kind == "json_object"
        label = "" if read else f"response_format.schema with type {kind or '(none)'}"
        return Placement("$.request.response_format.schema", response_format["schema"], read, label)
    if isinstance(request.get("json_schema"), dict):
        return Placement("$.request.json_schema", request["json_schema"], True)
    for field, label in IGNORED_FIELDS:
        if isinstance(request.get(field), dict) and request[field]:
            return Placement(f"$.request.{field}", request[field], False, label)
    return None


def relocated(request: JsonObject) -> JsonObject:
    """The request with its schema moved to where llama-server reads it (OpenAI's
    `response_format: {type: json_schema, json_schema: {name, schema}}`), the ignored field
    removed. Unchanged when the schema is already read (or there is none)."""
    placement = schema_placement(request)
    body = copy.deepcopy(request)
    if placement is None or placement.read:
        return body
    if placement.where == "$.request.response_format.schema":
        body.pop("response_format", None)
    else:
        body.pop(placement.where.removeprefix("$.request."), None)
    body["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "relocated", "schema": copy.deepcopy(placement.schema)},
    }
    return body


def unsupported_pattern(pattern: str) -> str | None:
    """Why b11434's converter accepts any string for this `pattern`, None when it can
    translate it (as far as this check knows: anchoring and `(?...)` groups)."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        return "not anchored with '^' and '$'"
    if "(?" in pattern:
        return "unsupported group syntax"
    return None


def unsupported_patterns(schema: Any) -> list[tuple[str, str]]:
    """(pattern, why) for every `pattern` in the schema the converter does not enforce.
    The walk is bounded (MAX_SCHEMA_NODES nodes); `patternProperties` keys are not read."""
    found: list[tuple[str, str]] = []
    stack: list[Any] = [schema]
    seen = 0
    while stack and seen < MAX_SCHEMA_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                why = unsupported_pattern(pattern)
                if why is not None:
                    found.append((pattern, why))
            stack.extend(v for k, v in node.items() if k not in ("const", "enum", "default"))
        elif isinstance(node, list):
            stack.extend(node)
    return found
