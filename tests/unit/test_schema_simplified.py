"""schema-simplified: the patterns b11434's grammar converter accepts any string for (not
anchored `^...$`, a `(?...)` group) in the schema it reads are rewritten so the grammar
enforces them, or dropped when they cannot be; the arm is planned only for such a schema;
its replies are judged against the client's ORIGINAL schema (a dropped pattern must not
make a reply pass); the cause is confirmed only when the arm removes the violation of a
reproduced baseline and rejected when it changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_backend import FakeBackend

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.capture import exchange_from_http
from triage.causes import ArmOutcome, Observations
from triage.engine import Diagnoser
from triage.engine.arms.schema import ARM, SIMPLIFIED_ARM
from triage.engine.causes.schema import CAUSE
from triage.engine.replayer import classify_reply
from triage.engine.servers import Server
from triage.llama.schema_fields import (
    JUDGE_KEY,
    enforceable_pattern,
    schema_placement,
    simplified,
    simplified_schema,
    unsupported_patterns,
)
from triage.stackfile import parse_stack
from triage.symptoms import classify

MESSAGES = [{"role": "user", "content": "Which city? JSON."}]


def _schema(pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"city": {"type": "string", "pattern": pattern}},
        "required": ["city"],
    }


def _places(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "openai": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": schema},
            }
        },
        "json-object": {"response_format": {"type": "json_object", "schema": schema}},
        "native": {"json_schema": schema},
    }


SAMPLES = ["ABC", "xABCy", "Paris", "PAR", "ab", "cd", "xaby", "a\nABC", "", "Pxyz", "abc"]


@pytest.mark.parametrize(
    ("pattern", "kept"),
    [
        ("[A-Z]{3}", "xxABCxx"),
        ("ab", "xaby"),
        ("^ab", "abc"),
        ("cd$", "xcd"),
        ("x|y", "ayb"),
        ("(?:ab|cd)", "xcdx"),
    ],
)
def test_a_rewritten_pattern_is_enforceable_and_accepts_only_what_the_original_accepts(
    pattern: str, kept: str
) -> None:
    rewritten = enforceable_pattern(pattern)
    assert rewritten is not None and rewritten != pattern
    assert not unsupported_patterns({"pattern": rewritten})  # the converter enforces it
    for sample in SAMPLES:
        if re.search(rewritten, sample):
            assert re.search(pattern, sample), (pattern, rewritten, sample)
    assert re.search(rewritten, kept) and not re.search(rewritten, "Paris")


@pytest.mark.parametrize("pattern", ["^(?=P)[A-Z]+$", "(?i)paris", "^a|b", "^(?!x).*$"])
def test_a_pattern_that_cannot_be_rewritten_is_dropped(pattern: str) -> None:
    assert enforceable_pattern(pattern) is None
    schema, done = simplified_schema(_schema(pattern))
    assert "pattern" not in schema["properties"]["city"]
    assert [(d.pattern, d.replacement) for d in done] == [(pattern, None)]


@pytest.mark.parametrize("place", ["openai", "json-object", "native"])
def test_the_arm_rewrites_the_read_schema_and_keeps_the_original_for_the_check(
    place: str,
) -> None:
    request = {"messages": MESSAGES, "max_tokens": 64, **_places(_schema("[A-Z]{3}"))[place]}
    before = json.dumps(request, sort_keys=True)
    assert SIMPLIFIED_ARM.applies(request) and not ARM.applies(request)
    body = simplified(request)
    placement = schema_placement(body)
    assert placement is not None and placement.read
    assert placement.where == schema_placement(request).where  # type: ignore[union-attr]
    sent = placement.schema["properties"]["city"]["pattern"]
    assert sent.startswith("^") and sent.endswith("$") and "[A-Z]{3}" in sent
    assert body[JUDGE_KEY] == _schema("[A-Z]{3}")
    assert body["messages"] == MESSAGES and body["max_tokens"] == 64
    assert json.dumps(request, sort_keys=True) == before  # not mutated


def test_the_arm_is_not_planned_without_an_unenforced_pattern_where_the_server_reads() -> None:
    anchored = {"messages": MESSAGES, "json_schema": _schema("^[A-Z]{3}$")}
    unread = {"messages": MESSAGES, "guided_json": _schema("[A-Z]{3}")}
    plain = {"messages": MESSAGES}
    for request in (anchored, unread, plain):
        assert not SIMPLIFIED_ARM.applies(request)
        assert simplified(request) == request
    assert ARM.applies(unread)  # the unread schema is relocated first


def _findings(request: dict[str, Any], content: str) -> list[Any]:
    body = {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
    }
    return [f for f in classify(exchange_from_http(request, body)) if f.kind == "schema-violation"]


def test_replies_to_the_arm_are_judged_against_the_original_schema() -> None:
    # A lookahead the arm must drop: a reply passing the weaker sent schema still violates.
    request = {"messages": MESSAGES, "json_schema": _schema("^(?=P)[A-Z]+$")}
    body = simplified(request)
    assert "pattern" not in body["json_schema"]["properties"]["city"]
    (violation,) = _findings(body, '{"city": "LYON"}')
    assert not violation.passed and "$.request.json_schema" in violation.reason
    assert all(f.passed for f in _findings(body, '{"city": "PARIS"}'))
    # Without the kept original the same reply would pass the sent (weaker) schema.
    weaker = {key: value for key, value in body.items() if key != JUDGE_KEY}
    assert all(f.passed for f in _findings(weaker, '{"city": "LYON"}'))


def _arm(name: str, n: int, failures: int, decision: str, **extra: Any) -> ArmOutcome:
    return ArmOutcome(name, n, failures, decision, p_value=0.001, **extra)


VIOLATED = {"schema-violation": 8}
PLANNED = Observations(planned=("baseline", "schema-simplified"))


def test_confirmed_when_the_simplified_schema_removes_the_violation() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED),
        "schema-simplified": _arm("schema-simplified", 8, 0, "removes"),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "confirmed" and verdict.deciding_probe == "schema-simplified"
    assert "0/8" in verdict.rationale and "8/8" in verdict.rationale
    assert "original schema" in verdict.rationale


def test_rejected_when_the_simplified_schema_leaves_the_failure_unchanged() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED),
        "schema-simplified": _arm("schema-simplified", 8, 8, "unchanged"),
    }
    verdict = CAUSE.decide(arms, PLANNED)
    assert verdict.status == "rejected" and verdict.deciding_probe == "schema-simplified"


def test_never_confirmed_without_a_reproduced_baseline_a_violation_or_the_arm() -> None:
    not_reproduced = {
        "baseline": _arm("baseline", 8, 0, "baseline"),
        "schema-simplified": _arm("schema-simplified", 8, 0, "removes"),
    }
    assert CAUSE.decide(not_reproduced, PLANNED).status == "suspected"
    no_violation = {
        "baseline": _arm("baseline", 8, 8, "baseline", kind_counts={"truncated": 8}),
        "schema-simplified": _arm("schema-simplified", 8, 0, "removes"),
    }
    verdict = CAUSE.decide(no_violation, PLANNED)
    assert verdict.status == "rejected" and "schema-violation" in verdict.rationale
    did_not_run = {"baseline": _arm("baseline", 8, 8, "baseline", kind_counts=VIOLATED)}
    verdict = CAUSE.decide(did_not_run, PLANNED)
    assert verdict.status == "suspected" and verdict.basis == "untested"


def _mock_llama_server(arm: str, body: dict[str, Any], server: Server, index: int) -> bool:
    """llama-server b11434 as measured, on a model that writes `{"city": "Paris"}` unless its
    grammar forbids it: a pattern the converter enforces makes it write the first string the
    pattern allows ("PAR" for `[A-Z]{3}`); a pattern it accepts any string for (or none)
    leaves "Paris". The reply is judged by the real check against the body the arm sent."""
    placement = schema_placement(body)
    enforced = (
        placement is not None and placement.read and not unsupported_patterns(placement.schema)
    )
    pattern = placement.schema["properties"]["city"].get("pattern") if placement else None
    city = "PAR" if enforced and pattern else "Paris"
    reply = {"choices": [{"message": {"content": json.dumps({"city": city})}}]}
    failed, kinds = classify_reply(body, 200, reply, 0.1)
    return failed and "schema-violation" in kinds


def _diagnose(store: Store, tmp_path: Path, pattern: str) -> dict[str, Any]:
    (tmp_path / "m.gguf").write_bytes(b"not a real model")
    stack = parse_stack(
        '[server]\nmodel = "m.gguf"\nargs = ["-c", "2048"]\n',
        base=tmp_path,
        source=str(tmp_path / "stack.toml"),
    )
    request = {"messages": MESSAGES, "max_tokens": 64, **_places(_schema(pattern))["openai"]}
    (finding,) = _findings(request, '{"city": "Paris"}')
    findings = [finding.record()]
    backend = FakeBackend(_mock_llama_server, kinds=("schema-violation",))
    diagnosis = Diagnoser(store, stack, request, findings=findings, backend=backend).run().to_json()
    validate_diagnosis(diagnosis)
    return diagnosis


def test_a_mock_server_confirms_an_unanchored_pattern_and_only_that(
    store: Store, tmp_path: Path
) -> None:
    diagnosis = _diagnose(store, tmp_path, "[A-Z]{3}")
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["schema-not-enforced"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == "schema-simplified"
    assert arms["schema-simplified"]["failures"] == 0 and arms["baseline"]["failures"] > 0
    assert "schema-relocated" not in arms
    assert [c for c, v in causes.items() if v["status"] == "confirmed"] == ["schema-not-enforced"]


def test_a_mock_server_rejects_when_the_dropped_pattern_still_fails_the_original(
    store: Store, tmp_path: Path
) -> None:
    # The lookahead cannot be rewritten: the arm drops it, the model still writes "Paris",
    # which passes the sent (weaker) schema but not the client's: unchanged, rejected.
    diagnosis = _diagnose(store, tmp_path, "^(?=P)[A-Z]+$")
    verdict = {c["id"]: c for c in diagnosis["causes"]}["schema-not-enforced"]
    assert verdict["status"] == "rejected" and verdict["deciding_probe"] == "schema-simplified"
    arm = {a["name"]: a for a in diagnosis["arms"]}["schema-simplified"]
    assert arm["failures"] == arm["n"] > 0
