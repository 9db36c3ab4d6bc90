"""schema-violation: content checked against the JSON Schema the request asked for, wherever
the client put it; not JSON, a wrong shape or a missing field is a finding at the content;
a reply that follows it, a request without a schema, an invalid schema, tool calls and
empty content are not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.symptoms import classify

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Where and when? JSON."}]
PLACES = {
    "openai": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    },
    "llama-object": {"response_format": {"type": "json_object", "schema": SCHEMA}},
    "llama-native": {"json_schema": SCHEMA},
}


def _findings(request: dict[str, Any], content: str, **message: Any) -> list[Any]:
    reply = {
        "choices": [
            {
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": "stop",
            }
        ]
    }
    exchange = exchange_from_http({"messages": MESSAGES, **request}, reply, status=200)
    return [f for f in classify(exchange) if f.kind == "schema-violation"]


@pytest.mark.parametrize("place", sorted(PLACES))
def test_content_that_violates_the_schema_is_a_finding_wherever_the_schema_is(
    place: str,
) -> None:
    (finding,) = _findings(PLACES[place], json.dumps({"city": "Paris"}))
    assert not finding.passed and "'year' is a required property" in finding.reason
    assert finding.where == "$.response.choices[0].message.content"
    (ok,) = _findings(PLACES[place], json.dumps({"city": "Paris", "year": 1889}))
    assert ok.passed


def test_plain_text_where_json_was_asked_for_is_a_finding() -> None:
    (finding,) = _findings(PLACES["openai"], "The tower is in Paris.")
    assert not finding.passed and "is not JSON" in finding.reason


def test_a_wrong_type_names_the_json_path() -> None:
    (finding,) = _findings(PLACES["llama-native"], '{"city": "Paris", "year": "1889"}')
    assert not finding.passed and "$.year" in finding.reason


def test_no_schema_an_invalid_schema_tool_calls_or_empty_content_are_not_findings() -> None:
    assert all(f.passed for f in _findings({}, "plain text is fine here"))
    bad = {"json_schema": {"type": "no-such-type"}}
    (finding,) = _findings(bad, "x")
    assert finding.passed and "not a valid JSON Schema" in finding.reason
    call = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert all(f.passed for f in _findings(PLACES["openai"], "", tool_calls=call))
    assert all(f.passed for f in _findings(PLACES["openai"], ""))


def test_deeply_nested_content_is_bounded_not_raised() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    findings = _findings(PLACES["llama-native"], deep)
    assert len(findings) == 1  # reported (not JSON it can parse), never a traceback
