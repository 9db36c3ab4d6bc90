"""schema-not-enforced: where llama-server (b11434, measured) reads a JSON Schema and where
it does not; the schema-relocated arm moves an unread schema to response_format.json_schema
and is planned only then; the cause is confirmed only when that arm removes the violation of
a reproduced baseline, rejected without a violation or when the arm changes nothing; the
schema-violation finding says which field llama-server ignored or which pattern it did not
enforce."""

from __future__ import annotations

from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.causes import ArmOutcome, Observations
from triage.engine.arms.schema import ARM, schema_unread
from triage.engine.causes.schema import CAUSE
from triage.llama.schema_fields import (
    MAX_SCHEMA_NODES,
    relocated,
    schema_placement,
    unsupported_patterns,
)
from triage.symptoms import classify

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES = [{"role": "user", "content": "Which city? JSON."}]
READ = {
    "openai": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    },
    "json-object": {"response_format": {"type": "json_object", "schema": SCHEMA}},
    "native": {"json_schema": SCHEMA},
}
UNREAD = {
    "guided_json": {"guided_json": SCHEMA},
    "ollama-format": {"format": SCHEMA},
    "text-type": {"response_format": {"type": "text", "schema": SCHEMA}},
    "no-type": {"response_format": {"schema": SCHEMA}},
}


@pytest.mark.parametrize("place", sorted(READ))
def test_a_schema_where_llama_server_reads_it_is_not_relocated(place: str) -> None:
    request = {"messages": MESSAGES, **READ[place]}
    placement = schema_placement(request)
    assert placement is not None and placement.read and placement.schema == SCHEMA
    assert not schema_unread(request)
    assert relocated(request) == request


@pytest.mark.parametrize("place", sorted(UNREAD))
def test_a_schema_llama_server_ignores_is_moved_where_it_reads_it(place: str) -> None:
    request = {"messages": MESSAGES, "max_tokens": 64, **UNREAD[place]}
    placement = schema_placement(request)
    assert placement is not None and not placement.read
    assert schema_unread(request)
    moved = relocated(request)
    assert moved["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "relocated", "schema": SCHEMA},
    }
    assert "guided_json" not in moved and "format" not in moved
    assert moved["messages"] == MESSAGES and moved["max_tokens"] == 64
    assert schema_placement(moved) is not None and schema_placement(moved).read  # type: ignore[union-attr]
    assert request == {"messages": MESSAGES, "max_tokens": 64, **UNREAD[place]}  # not mutated


def test_no_schema_plans_no_arm() -> None:
    request = {"messages": MESSAGES, "format": {}, "response_format": {"type": "text"}}
    assert schema_placement(request) is None and not ARM.applies(request)


def test_patterns_the_converter_accepts_any_string_for_are_named() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "[A-Z]{3}"},
            "id": {"type": "string", "pattern": "^(?=P)[A-Z]+$"},
            "ok": {"type": "string", "pattern": "^[a-z]+$"},
        },
    }
    found = dict(unsupported_patterns(schema))
    assert found == {
        "[A-Z]{3}": "not anchored with '^' and '$'",
        "^(?=P)[A-Z]+$": "unsupported group syntax",
    }
    # Bounded: a schema wider than the walk's limit is cut short, never raised.
    wide = {"anyOf": [{"pattern": "x"} for _ in range(MAX_SCHEMA_NODES * 2)]}
    assert 0 < len(unsupported_patterns(wide)) < MAX_SCHEMA_NODES


def _reply(request: dict[str, Any], content: str) -> list[Any]:
    body = {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
    }
    return [f for f in classify(exchange_from_http(request, body)) if f.kind == "schema-violation"]


def test_the_finding_names_the_field_llama_server_ignored() -> None:
    request = {"messages": MESSAGES, "guided_json": SCHEMA}
    (finding,) = _reply(request, "It is in Paris.")
    assert not finding.passed and "guided_json" in finding.reason
    assert "does not read" in finding.reason
    assert all(f.passed for f in _reply(request, '{"city": "Paris"}'))


def test_the_finding_names_an_unenforced_pattern() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "pattern": "[A-Z]{3}"}}}
    request = {"messages": MESSAGES, "json_schema": schema}
    (finding,) = _reply(request, '{"city": "Paris"}')
    assert not finding.passed and "'[A-Z]{3}'" in finding.reason
    assert "not anchored" in finding.reason


def _arm(name: str, n: int, failures: int, decision: str, **extra: Any) -> ArmOutcome:
    return ArmOutcome(name, n, failures, decision, p_value=0.001, **extra)


VIOLATED = {"schema-violation": 8}
PLANNED = Observations(planned=("baseline", "schema-relocated"))


def test_confirmed_when_the_relocated_schema_removes_the_violation() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED),
        "schema-relocated": _arm("schema-relocated", 8, 0, "removes"),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "confirmed" and verdict.deciding_probe == "schema-relocated"
    assert "0/8" in verdict.rationale and "8/8" in verdict.rationale


def test_rejected_when_the_relocated_schema_changes_nothing() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED),
        "schema-relocated": _arm("schema-relocated", 8, 8, "unchanged"),
    }
    assert CAUSE.decide(arms, PLANNED).status == "rejected"


def test_rejected_when_no_reply_violates_a_schema() -> None:
    base = _arm("baseline", 8, 8, "baseline", kind_counts={"truncated": 8})
    for obs, arms in (
        (Observations(planned=("baseline",)), {"baseline": base}),
        (
            PLANNED,
            {"baseline": base, "schema-relocated": _arm("schema-relocated", 8, 0, "removes")},
        ),
    ):
        verdict = CAUSE.decide(arms, obs)
        assert verdict.status == "rejected" and "schema-violation" in verdict.rationale


def test_never_confirmed_without_a_reproduced_baseline_or_the_arm() -> None:
    not_reproduced = {
        "baseline": _arm("baseline", 8, 0, "baseline"),
        "schema-relocated": _arm("schema-relocated", 8, 0, "removes"),
    }
    verdict = CAUSE.decide(not_reproduced, PLANNED)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    read_but_violated = {"baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED)}
    verdict = CAUSE.decide(read_but_violated, Observations(planned=("baseline",)))
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "pattern" in verdict.rationale


def test_an_empty_schema_in_an_ignored_field_is_no_schema_but_an_empty_read_one_still_is() -> None:
    (none,) = _reply({"messages": MESSAGES, "format": {}}, "It is in Paris.")
    assert none.passed and "no JSON schema" in none.reason
    (finding,) = _reply({"messages": MESSAGES, "json_schema": {}}, "It is in Paris.")
    assert not finding.passed and "$.request.json_schema" in finding.reason
