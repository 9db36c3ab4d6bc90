"""Built-in checks on structured output and the thought channel: structured-output-failed,
reasoning-markup-in-content.

* `structured-output-failed`: the request asked for structured output (`response_format`
  json_object / json_schema, a top-level `json_schema`, or a GBNF `grammar`) and the reply
  holds none: the server refused the output ("does not match the expected ... format"), or
  content is empty while the thought holds text -- the grammar constrained a thought that
  then could never be closed (a template that opens the thought in the prompt), so
  everything landed in reasoning_content.
* `reasoning-markup-in-content`: thought markup (`<think>`, Gemma 4's
  `<|channel>thought ... <channel|>`, gpt-oss's analysis channel, Mistral's `[THINK]`)
  appears in content: the server did not split the thought off (`--reasoning-format none`,
  a parser that does not know the template, a parser change between builds).
"""

from __future__ import annotations

import json
import re

from kb.jsontypes import JsonObject
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

# llama.cpp's chat parsers (PEG formats and the older ones) reject output this way.
_FORMAT_REFUSED = re.compile(
    r"does not match the expected (?P<format>[\w.\- ]{1,60}?) format"
    r"|Failed to parse input at pos \d+"
)
# Thought markup of the chat formats llama-server serves. Tool-call markup is
# tool-markup-leaked's (gpt-oss `commentary to=functions.` is a call, not a thought).
_THOUGHT_MARKUP = re.compile(
    r"</?think>"  # DeepSeek R1, Qwen3, QwQ, GLM, ...
    r"|<\|channel>thought|<channel\|>"  # Gemma 4
    r"|<\|channel\|>analysis"  # gpt-oss harmony
    r"|\[/?THINK\]"  # Mistral / Magistral
    r"|<\|(?:begin|end)_of_thought\|>"
    r"|</?seed:think>"  # Seed-OSS
)
_MARKUP_TRIGGERS = ("think", "channel", "THINK", "_of_thought")


def structured_output_requested(request: JsonObject) -> str | None:
    """Which structured-output field the request sets (None when it asks for plain text)."""
    grammar = request.get("grammar")
    if isinstance(grammar, str) and grammar.strip():
        return "grammar"
    if isinstance(request.get("json_schema"), dict):
        return "json_schema"
    response_format = _dict_or_empty(request.get("response_format"))
    kind = response_format.get("type")
    if kind in ("json_object", "json_schema"):
        return f"response_format {kind}"
    return None


def _error_text(view: View) -> str:
    if view.error is not None:
        message = view.error.get("message")
        return message if isinstance(message, str) else json.dumps(view.error, default=str)
    return view.response_text or ""


@check("structured-output-failed", number=14)
def check_structured_output(view: View) -> list[Finding]:
    """Structured output was asked for and the reply has none (refused, or all in the thought)."""
    kind = "structured-output-failed"
    asked = structured_output_requested(view.request)
    if asked is None:
        return _pass(kind, "the request asks for no structured output")
    text = _error_text(view)[:4000]
    match = _FORMAT_REFUSED.search(text) if text else None
    if match:
        status = f"HTTP {view.status}: " if view.status else ""
        return [
            Finding(
                kind,
                False,
                1.0,
                f"{status}the request sets {asked} and the server refused the model's output: "
                f"{text[:200]}",
                "$.error.message" if view.error is not None else "$.response_text",
                match.start(),
            )
        ]
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    findings = []
    for choice in view.choices:
        if choice.content.strip() or choice.tool_calls or not choice.reasoning.strip():
            continue
        findings.append(
            Finding(
                kind,
                False,
                1.0,
                f"the request sets {asked}, content is empty and reasoning_content holds "
                f"{len(choice.reasoning)} chars (finish_reason={choice.finish_reason}): the "
                "structured answer landed in the thought",
                choice.reasoning_path,
            )
        )
    return findings or _pass(kind, f"the request sets {asked} and content is present")


@check("reasoning-markup-in-content", number=15)
def check_reasoning_markup(view: View) -> list[Finding]:
    """Thought markup appears in content: the server did not separate the thought."""
    kind = "reasoning-markup-in-content"
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    findings = []
    for choice in view.choices:
        scanned = choice.content[:MAX_SCAN_CHARS]
        if not any(trigger in scanned for trigger in _MARKUP_TRIGGERS):
            continue
        match = _THOUGHT_MARKUP.search(scanned)
        if match:
            findings.append(
                Finding(
                    kind,
                    False,
                    1.0,
                    f"thought markup {match.group(0)!r} in content at offset {match.start()}: "
                    "the reasoning was not split into reasoning_content",
                    choice.content_path,
                    match.start(),
                )
            )
    return findings or _pass(kind, "no thought markup in content")


CHECKS = (check_structured_output, check_reasoning_markup)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
