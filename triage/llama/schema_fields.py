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
    schema: JsonObject  # as the client sent it
    read: bool
    label: str = ""


def _dict(value: Any) -> JsonObject:
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


# What b11434's pattern converter (common/json-schema-to-grammar.cpp, `_pattern_to_rule`)
# accepts after a backslash: outside a character class an escaped regex operator or one of
# gbnf's own escapes; inside a class only gbnf's (`gbnf_escape_length`). Anything else (`\d`,
# `\w`, `\s`, `\/`, `\b`...) is logged "unsupported escape" and accepts any string.
_REGEX_OPERATORS = frozenset("^$.[]()|{}*+?")
_GBNF_ESCAPES = frozenset('trn\\"[]-')
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def _escape_length(pattern: str, pos: int, in_class: bool) -> int:
    """Characters the converter consumes for the escape at `pos` (0: unsupported)."""
    if pos + 1 >= len(pattern):
        return 0
    char = pattern[pos + 1]
    if char in _GBNF_ESCAPES or (not in_class and char in _REGEX_OPERATORS):
        return 2
    digits = _HEX_DIGITS.get(char, 0)
    hex_part = pattern[pos + 2 : pos + 2 + digits]
    if digits and len(hex_part) == digits and all(c in "0123456789abcdefABCDEF" for c in hex_part):
        return 2 + digits
    return 0


def _unsupported_inside(core: str) -> str | None:
    """Why the converter rejects the inside of an anchored pattern (its own words)."""
    i, in_class = 0, False
    while i < len(core):
        char = core[i]
        if char == "\\":
            length = _escape_length(core, i, in_class)
            if length == 0:
                where = " in character class" if in_class else ""
                return f"unsupported escape{where}: {core[i : i + 2]}"
            i += length
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(" and core[i + 1 : i + 3] != "?:" and core[i + 1 : i + 2] == "?":
            return "unsupported group syntax"
        elif char in "^$":
            return "anchor inside the pattern"
        i += 1
    return None


def unsupported_pattern(pattern: str) -> str | None:
    """Why b11434's converter accepts any string for this `pattern` (its log's wording),
    None when it translates it: anchoring `^...$`, lookarounds and other `(?` groups,
    anchors inside, and the escapes it does not know (`\\d`, `\\w`, `\\s`, `\\/`...)."""
    if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
        return "not anchored with '^' and '$'"
    return _unsupported_inside(pattern[1:-1])


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
    unanchored search): named groups made plain groups, the escapes it does not know
    rewritten (`\\d` as `[0-9]`, `\\w` as `[A-Za-z0-9_]`, `\\s` as `[ \\t\\n\\r]`: ASCII
    subsets of what they match; escaped punctuation as `\\xHH`), an unanchored end padded
    with PAD and anchored. None when it cannot be rewritten (a lookaround, inline flags,
    `\\b`, `\\D`, a backreference, an alternation anchored on one side only): the arm then
    drops the pattern."""
    if unsupported_pattern(pattern) is None:
        return pattern
    core = _NAMED_GROUP.sub("(", pattern.replace("(?:", "("))
    if "(?" in core:
        return None
    start = core.startswith("^")
    end = _ends_with_anchor(core)
    escaped = _rewrite_escapes(core[1 if start else 0 : len(core) - 1 if end else len(core)])
    if escaped is None:
        return None
    core = escaped
    if _top_level_alternation(core):
        if start or end:
            return None  # `^a|b` anchors one alternative only
        core = f"({core})"
    rewritten = f"^{'' if start else PAD}{core}{'' if end else PAD}$"
    return rewritten if unsupported_pattern(rewritten) is None else None


# Shorthand classes the converter does not know, as the ASCII subsets it can enforce (every
# string they accept matches the shorthand in Python's `re`, which judges the replies).
_SHORTHANDS = {"d": "0-9", "w": "A-Za-z0-9_", "s": " \\t\\n\\r"}


def _rewrite_escapes(core: str) -> str | None:
    """`core` with every escape the converter rejects rewritten (see enforceable_pattern),
    None when one has no equivalent it enforces."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(core):
        char = core[i]
        if char != "\\":
            if in_class:
                in_class = char != "]"
            elif char == "[":
                in_class = True
            out.append(char)
            i += 1
            continue
        length = _escape_length(core, i, in_class)
        if length:
            out.append(core[i : i + length])
            i += length
            continue
        follow = core[i + 1 : i + 2]
        if follow in _SHORTHANDS:
            out.append(_SHORTHANDS[follow] if in_class else f"[{_SHORTHANDS[follow]}]")
        elif follow and follow.isascii() and not follow.isalnum() and follow.isprintable():
            out.append(f"\\x{ord(follow):02X}")
        else:
            return None  # \b, \D, \W, \S, a backreference, \p{...}, a trailing backslash
        i += 2
    return "".join(out)


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
