"""Built-in checks on tool calls: tool-args-invalid-json, tool-args-schema-violation,
tool-markup-leaked."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from triage.catalogue import Catalogue
from triage.checks.base import (
    MAX_SCAN_CHARS,
    Finding,
    View,
    _dict_or_empty,
    _no_completion_reason,
    _pass,
    check,
)

# --------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------


def _iter_tool_calls(view: View) -> Iterable[tuple[str, str | None, Any]]:
    """(JSON path of arguments, tool name, raw arguments) for every tool call."""
    for choice in view.choices:
        for j, call in enumerate(choice.tool_calls):
            function = _dict_or_empty(_dict_or_empty(call).get("function"))
            name = function.get("name")
            yield (
                f"{choice.path}.tool_calls[{j}].function.arguments",
                name if isinstance(name, str) else None,
                function.get("arguments"),
            )


def _parse_arguments(raw: Any) -> tuple[Any, str | None, int | None]:
    """(parsed arguments, error, char offset of the error)."""
    if isinstance(raw, dict):
        return raw, None, None
    if raw is None:
        return None, "arguments are missing", None
    if not isinstance(raw, str):
        return None, f"arguments are a JSON {type(raw).__name__}, not an object string", None
    if not raw.strip():
        return None, "arguments are an empty string (JSON.parse fails on it)", 0
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"arguments are not valid JSON: {exc.msg} at char {exc.pos}", exc.pos
    except (ValueError, RecursionError) as exc:
        return None, f"arguments are not valid JSON: {type(exc).__name__}", None
    if not isinstance(value, dict):
        return None, f"arguments are JSON but a {type(value).__name__}, not an object", 0
    return value, None, None


@check("tool-args-invalid-json", number=4)
def check_tool_args_json(view: View) -> list[Finding]:
    """Every tool call's arguments parse as a JSON object."""
    kind = "tool-args-invalid-json"
    findings = []
    count = 0
    for path, name, raw in _iter_tool_calls(view):
        count += 1
        _, error, offset = _parse_arguments(raw)
        if error is not None:
            label = f"tool call {name!r}: " if name else "tool call: "
            findings.append(Finding(kind, False, 1.0, label + error, path, offset))
    if findings:
        return findings
    return _pass(
        kind, f"{count} tool call(s) with JSON-object arguments" if count else "no tool calls"
    )


_VALIDATOR_CACHE: dict[str, Any] = {}
_VALIDATOR_CACHE_LIMIT = 256


def _validator(schema: Any) -> Any:
    """A cached validator for a tool's parameter schema, or None if the schema is unusable."""
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return None
    if key in _VALIDATOR_CACHE:
        return _VALIDATOR_CACHE[key]
    validator = None
    if isinstance(schema, dict):
        try:
            cls = jsonschema.validators.validator_for(
                schema, default=jsonschema.Draft202012Validator
            )
            cls.check_schema(schema)
            validator = cls(schema)
        except Exception:  # noqa: BLE001 -- a broken tool schema is the client's problem
            validator = None
    if len(_VALIDATOR_CACHE) >= _VALIDATOR_CACHE_LIMIT:
        _VALIDATOR_CACHE.clear()
    _VALIDATOR_CACHE[key] = validator
    return validator


@check("tool-args-schema-violation", number=5)
def check_tool_args_schema(view: View) -> list[Finding]:
    """Tool-call arguments validate against the request's tools[].function.parameters."""
    kind = "tool-args-schema-violation"
    calls = list(_iter_tool_calls(view))
    if not calls:
        return _pass(kind, "no tool calls")
    declared = view.declared_tools()
    if declared is None:
        return _pass(kind, "the request declares no tools (or is not in the capture); not checked")
    findings = []
    for path, name, raw in calls:
        if name not in declared:
            findings.append(
                Finding(
                    kind,
                    False,
                    1.0,
                    f"tool {name!r} is not among the request's tools "
                    f"({', '.join(sorted(declared))})",
                    path.rsplit(".arguments", 1)[0] + ".name",
                )
            )
            continue
        arguments, error, _ = _parse_arguments(raw)
        if error is not None:
            continue  # tool-args-invalid-json reports it
        schema = declared[name]
        if schema is None:
            continue
        validator = _validator(schema)
        if validator is None:
            continue
        try:
            errors = list(validator.iter_errors(arguments))
        except Exception:  # noqa: BLE001 -- unresolvable $ref and the like: cannot judge
            continue
        if errors:
            error_obj = best_match(errors)
            inner = error_obj.json_path[1:]  # "$.a.b" -> ".a.b"
            findings.append(
                Finding(
                    kind,
                    False,
                    1.0,
                    f"tool {name!r} arguments violate its schema: {error_obj.message[:300]}",
                    path + inner,
                )
            )
    return findings or _pass(kind, f"{len(calls)} tool call(s) match their schemas")


# Tool-call syntax of the chat templates llama-server serves; seen in the text, it means
# the server's parser did not turn the call into `tool_calls`.
_MARKUP = re.compile(
    r"<\|tool_call>|<tool_call\|>|<\|\"\|>"  # Gemma 4
    r"|(?<![\w.])call:[A-Za-z_][\w.\-]*\{"  # Gemma 4 call body
    r"|</?tool_call>"  # Hermes / Qwen
    r"|<\|tool_calls_section_begin\|>|<\|tool_call_begin\|>"  # Kimi
    r"|<｜tool▁calls?▁begin｜>"  # DeepSeek
    r"|\[TOOL_CALLS\]"  # Mistral
    r"|<\|python_tag\|>"  # Llama 3.x
    r"|<function=[\w.\-]+>"  # Qwen3-Coder / Llama XML calls
    r"|<\|channel\|>commentary to=functions\."  # gpt-oss harmony
)
# Every alternative of _MARKUP contains one of these literals.
_MARKUP_TRIGGERS = ("<|", "call:", "tool_call", "<\uff5c", "[TOOL_CALLS]", "<function=")
_BARE_CALL = re.compile(
    r"\{\s*\"(?:name|function)\"\s*:\s*\"([^\"\\]{1,128})\"\s*,\s*\"(?:arguments|parameters)\"\s*:"
)
# A bare {"name": ..., "arguments": ...} is only a leak when it names a declared tool; with
# no request in the capture it is likely one, but not certain.
BARE_CALL_UNKNOWN_REQUEST_SCORE = 0.5


@check("tool-markup-leaked", number=6)
def check_tool_markup(view: View) -> list[Finding]:
    """Tool-call syntax appears as text in content or reasoning instead of in tool_calls."""
    kind = "tool-markup-leaked"
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    declared = view.declared_tools()
    request_known = bool(view.request)
    findings = []
    for choice in view.choices:
        for text, path, channel in (
            (choice.content, choice.content_path, "content"),
            (choice.reasoning, choice.reasoning_path, "reasoning"),
        ):
            if not text:
                continue
            scanned = text[:MAX_SCAN_CHARS]
            # Substring tests run in C; the regex only runs on text that may hold markup.
            has_markup = any(trigger in scanned for trigger in _MARKUP_TRIGGERS)
            match = _MARKUP.search(scanned) if has_markup else None
            if match:
                findings.append(
                    Finding(
                        kind,
                        False,
                        1.0,
                        f"tool-call markup {match.group(0)!r} in {channel} "
                        "(the call was not parsed)",
                        path,
                        match.start(),
                    )
                )
                continue
            if '"name"' not in scanned and '"function"' not in scanned:
                continue
            for bare in _BARE_CALL.finditer(scanned):
                name = bare.group(1)
                if declared is not None and name in declared:
                    score = 1.0
                elif not request_known:
                    score = BARE_CALL_UNKNOWN_REQUEST_SCORE
                else:
                    continue
                findings.append(
                    Finding(
                        kind,
                        False,
                        score,
                        f'a bare tool call {{"name": {name!r}, "arguments": ...}} in {channel}'
                        + (
                            ""
                            if score == 1.0
                            else " (request not captured: cannot tell it is a declared tool)"
                        ),
                        path,
                        bare.start(),
                    )
                )
                break
    return findings or _pass(kind, "no tool-call markup in content or reasoning")


CHECKS = (check_tool_args_json, check_tool_args_schema, check_tool_markup)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
