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
import re
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


# The key under which the schema-simplified arm's request keeps the client's own schema, so
# its replies are judged against the original (a dropped pattern would make them pass a
# weaker schema). llama-server ignores unknown top-level fields (measured on b11434).
JUDGE_KEY = "x_triage_judge_schema"
# What pads an unanchored end: any character a JSON string holds unescaped. `.*` is not
# enough (measured on b11434: with `^.*[A-Z]{3}.*$` the model still wrote "Paris" -- `.`
# lets it close the string itself); this class keeps the pad inside the string.
PAD = r'[^"\\\x00-\x1F]*'
_NAMED_GROUP = re.compile(r"\(\?P?<(?![=!])[A-Za-z_][A-Za-z0-9_]*>")


def _ends_with_anchor(pattern: str) -> bool:
    """Does the pattern end with an unescaped `$`?"""
    if not pattern.endswith("$"):
        return False
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def _top_level_alternation(pattern: str) -> bool:
    """Is there a `|` outside every group and character class?"""
    depth, in_class, escaped = 0, False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "|" and depth == 0:
            return True
    return False


def enforceable_pattern(pattern: str) -> str | None:
    """A pattern b11434's converter enforces whose matches all match `pattern` (JSON Schema's
    unanchored search): non-capturing and named groups made plain groups, an unanchored end
    padded with PAD and anchored. None when it cannot be rewritten (a lookaround, inline
    flags, an alternation anchored on one side only): the arm then drops the pattern."""
    if unsupported_pattern(pattern) is None:
        return pattern
    core = _NAMED_GROUP.sub("(", pattern.replace("(?:", "("))
    if "(?" in core:
        return None
    start = core.startswith("^")
    end = _ends_with_anchor(core)
    core = core[1 if start else 0 : len(core) - 1 if end else len(core)]
    if _top_level_alternation(core):
        if start or end:
            return None  # `^a|b` anchors one alternative only
        core = f"({core})"
    rewritten = f"^{'' if start else PAD}{core}{'' if end else PAD}$"
    return rewritten if unsupported_pattern(rewritten) is None else None


@dataclass(frozen=True)
class Simplification:
    """What the schema-simplified arm did to one pattern (`replacement` None: dropped)."""

    pattern: str
    replacement: str | None


def simplified_schema(schema: Any) -> tuple[Any, list[Simplification]]:
    """A copy of the schema with every pattern the converter does not enforce rewritten so it
    does (enforceable_pattern) or dropped, and what was done. Bounded like
    unsupported_patterns; `const`, `enum` and `default` values are data, never walked."""
    copied = copy.deepcopy(schema)
    done: list[Simplification] = []
    stack: list[Any] = [copied]
    seen = 0
    while stack and seen < MAX_SCHEMA_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and unsupported_pattern(pattern) is not None:
                replacement = enforceable_pattern(pattern)
                if replacement is None:
                    del node["pattern"]
                else:
                    node["pattern"] = replacement
                done.append(Simplification(pattern, replacement))
            stack.extend(v for k, v in node.items() if k not in ("const", "enum", "default"))
        elif isinstance(node, list):
            stack.extend(node)
    return copied, done


def has_unenforced_pattern(request: JsonObject) -> bool:
    """Does the request carry, where llama-server reads it, a schema with a pattern its
    converter accepts any string for?"""
    placement = schema_placement(request)
    return placement is not None and placement.read and bool(unsupported_patterns(placement.schema))


def simplified(request: JsonObject) -> JsonObject:
    """The request with the schema llama-server reads simplified (simplified_schema) in
    place and the original kept under JUDGE_KEY for the schema-violation check. Unchanged
    when the read schema has no unenforced pattern."""
    body = copy.deepcopy(request)
    if not has_unenforced_pattern(request):
        return body
    placement = schema_placement(request)
    assert placement is not None
    schema, _ = simplified_schema(placement.schema)
    if placement.where == READ_PLACE:
        body["response_format"]["json_schema"]["schema"] = schema
    elif placement.where == "$.request.response_format.schema":
        body["response_format"]["schema"] = schema
    else:
        body["json_schema"] = schema
    body[JUDGE_KEY] = copy.deepcopy(placement.schema)
    return body
