"""Built-in check `schema-violation`: the request asked for content that follows a JSON Schema
and the reply's content does not -- it is not JSON, or it violates the schema -- with HTTP
200. llama-server turns a schema into a grammar; when the conversion fails open (the schema
in a place the server does not read, a construct its converter cannot handle: "failed to
parse grammar" in its log), nothing constrains the output and plain text or a wrong shape
comes back as a success.

The schema is read where clients put it: `response_format.json_schema.schema` (OpenAI),
`response_format.schema` (llama.cpp's json_object extension) and a top-level `json_schema`
(llama.cpp's own). Validation uses jsonschema (draft 2020-12 unless the schema names its
own `$schema`), bounded: content above MAX_CONTENT_CHARS or nested deeper than Python's
parser allows is reported as unchecked, never raised.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import SchemaError, best_match

from kb.jsontypes import JsonObject
from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _dict_or_empty, _pass, check
from triage.llama.schema_fields import (
    IGNORED_FIELDS,
    JUDGE_KEY,
    schema_placement,
    unsupported_patterns,
)

KIND = "schema-violation"
MAX_CONTENT_CHARS = 1_000_000


def requested_schema(request: JsonObject) -> tuple[str, dict[str, Any]] | None:
    """(where the request puts it, the JSON Schema) or None when it sets none. A request
    the schema-simplified arm rewrote is judged against the client's original schema
    (JUDGE_KEY), never the simplified one it sent."""
    response_format = _dict_or_empty(request.get("response_format"))
    inner = _dict_or_empty(response_format.get("json_schema"))
    candidates = (
        ("$.request.response_format.json_schema.schema", inner.get("schema")),
        ("$.request.response_format.schema", response_format.get("schema")),
        ("$.request.json_schema", request.get("json_schema")),
        # Other servers' fields llama-server ignores: only a non-empty schema counts there.
        *((f"$.request.{field}", request.get(field) or None) for field, _ in IGNORED_FIELDS),
    )
    judge = request.get(JUDGE_KEY)
    for where, schema in candidates:
        if isinstance(schema, dict):
            return where, judge if isinstance(judge, dict) else schema
    return None


def _unread_note(request: JsonObject) -> str:
    """Why the grammar failed open, when the request shows it: a place llama-server does not
    read the schema from, or patterns its converter accepts any string for."""
    placement = schema_placement(request)
    if placement is not None and not placement.read:
        return (
            f"; llama-server does not read a schema from {placement.where} "
            f"({placement.label}): nothing constrained the output (schema-not-enforced)"
        )
    patterns = unsupported_patterns(placement.schema if placement else {})
    if patterns:
        pattern, why = patterns[0]
        return (
            f"; its converter accepts any string for pattern {pattern[:80]!r} ({why}), "
            "so the grammar does not enforce it (schema-not-enforced)"
        )
    return ""


@check(KIND, number=24)
def check_schema_violation(view: View) -> list[Finding]:
    """The content does not follow the JSON Schema the request asked for."""
    found = requested_schema(view.request)
    if found is None:
        return _pass(KIND, "the request sets no JSON schema")
    where, schema = found
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
    except SchemaError as exc:
        return _pass(KIND, f"the request's schema ({where}) is not a valid JSON Schema: {exc}")
    validator = validator_class(schema)
    findings: list[Finding] = []
    for choice in view.choices:
        content = choice.content.strip()
        if not content or choice.tool_calls:
            continue  # no content: structured-output-failed's case
        if len(content) > MAX_CONTENT_CHARS:
            continue
        try:
            value = json.loads(content)
        except (ValueError, RecursionError) as exc:
            findings.append(
                Finding(
                    KIND,
                    False,
                    1.0,
                    f"the request sets a JSON schema ({where}) and the content is not JSON "
                    f"({type(exc).__name__}: {str(exc)[:120]}): nothing enforced the schema"
                    + _unread_note(view.request),
                    choice.content_path,
                )
            )
            continue
        try:
            error = best_match(validator.iter_errors(value))
        except RecursionError:
            continue
        if error is not None:
            findings.append(
                Finding(
                    KIND,
                    False,
                    1.0,
                    f"the content violates the request's JSON schema ({where}) at "
                    f"{error.json_path}: {error.message[:200]}" + _unread_note(view.request),
                    choice.content_path,
                )
            )
    return findings or _pass(KIND, f"the content follows the request's JSON schema ({where})")


CHECKS = (check_schema_violation,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
