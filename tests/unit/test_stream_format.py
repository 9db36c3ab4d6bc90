"""stream-format-violation: strict per-delta validation of streamed replies (issue 24).

Real llama-server b11434 streams (tests/fixtures/captures/real, recorded from the drill
server) are well formed and pass; each rule of the OpenAI chunk format is broken once in a
constructed stream and must be reported at the bad delta's event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from triage.capture.stream import reassemble_sse
from triage.capture.stream_format import MAX_VIOLATIONS, STREAM_FORMAT_KEY
from triage.checks.stream_format import KIND
from triage.symptoms import classify

REAL = Path(__file__).parent.parent / "fixtures" / "captures" / "real"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "captures"

FIRST = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}}


def _chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}],
    }


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return _chunk({"tool_calls": list(calls)})


def _args(text: str, index: int = 0) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": text}}


def _sse(*chunks: dict[str, Any], done: bool = True) -> str:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return text + ("data: [DONE]\n\n" if done else "")


def _failed(text: str) -> list[Any]:
    body = reassemble_sse(text, "stream.sse")
    exchange = {"request": {"stream": True}, "response": body.response, "status": 200}
    return [f for f in classify(exchange) if f.kind == KIND and not f.passed]


def _good(*middle: dict[str, Any]) -> str:
    return _sse(
        _chunk({"role": "assistant", "content": None}),
        *middle,
        _chunk({}, "tool_calls"),
    )


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("*.sse")))
def test_real_server_streams_are_well_formed(name: str) -> None:
    body = reassemble_sse((REAL / name).read_text(), name)
    assert body.response is not None and STREAM_FORMAT_KEY not in body.response
    exchange = {"request": {"stream": True}, "response": body.response, "status": 200}
    (finding,) = [f for f in classify(exchange) if f.kind == KIND]
    assert finding.passed


def test_interleaved_parallel_calls_are_well_formed() -> None:
    text = (FIXTURES / "stream-tool-deltas.sse").read_text()
    assert _failed(text) == []


def test_a_well_formed_constructed_stream_passes() -> None:
    text = _good(
        _calls({**FIRST, "function": {"name": "get_weather", "arguments": '{"a":'}}),
        _calls(_args("1}")),
    )
    assert _failed(text) == []


@pytest.mark.parametrize(
    ("first", "missing"),
    [
        ({"index": 0, "type": "function", "function": {"name": "f"}}, "id"),
        ({"index": 0, "id": "c", "type": "tool", "function": {"name": "f"}}, "type function"),
        ({"index": 0, "id": "c", "type": "function", "function": {"arguments": ""}}, "name"),
    ],
)
def test_first_delta_without_id_type_or_name(first: dict[str, Any], missing: str) -> None:
    (finding,) = _failed(_good(_calls(first), _calls(_args("{}"))))
    assert "tool-first-delta" in finding.reason and missing in finding.reason
    assert finding.reason.startswith("event 2 (line 3)")
    assert finding.where == f"$.response.{STREAM_FORMAT_KEY}.violations[0].event"


def test_a_first_delta_without_type_is_allowed_as_the_format_marks_it_optional() -> None:
    first = {"index": 0, "id": "c", "function": {"name": "get_weather", "arguments": ""}}
    assert _failed(_good(_calls(first), _calls(_args("{}")))) == []


def test_repeated_name_is_reported_at_its_event() -> None:
    again = {"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}
    (finding,) = _failed(_good(_calls(FIRST), _calls(again)))
    assert "tool-name-repeated" in finding.reason and finding.reason.startswith("event 3 ")


def test_index_that_jumps_and_index_that_changes() -> None:
    jump = {**FIRST, "index": 2, "function": {"name": "f", "arguments": "{}"}}
    (finding,) = _failed(_good(_calls(jump)))
    assert "tool-index-jump" in finding.reason and "expected 0" in finding.reason
    moved = {"index": 1, "id": "call_1", "function": {"arguments": "{}"}}
    reasons = [f.reason for f in _failed(_good(_calls(FIRST), _calls(moved)))]
    assert any("tool-index-changed" in r and "call_1" in r for r in reasons)


def test_second_id_at_an_index_in_use() -> None:
    other = {**FIRST, "id": "call_2", "function": {"arguments": "{}"}}
    reasons = [f.reason for f in _failed(_good(_calls(FIRST), _calls(other)))]
    assert any("tool-index-reused" in r for r in reasons)


def test_tool_call_delta_without_index() -> None:
    (finding,) = _failed(
        _good(_calls({k: v for k, v in FIRST.items() if k != "index"}), _calls(_args("{}")))
    )
    assert "tool-index" in finding.reason and "event 2" in finding.reason


def test_arguments_that_do_not_concatenate_to_json() -> None:
    (finding,) = _failed(_good(_calls(FIRST), _calls(_args('{"a":')), _calls(_args("1"))))
    assert "tool-arguments-json" in finding.reason and finding.reason.startswith("event 2 ")


def test_arguments_sent_as_an_object() -> None:
    delta = {**FIRST, "function": {"name": "f", "arguments": {"a": 1}}}
    (finding,) = _failed(_good(_calls(delta)))
    assert "tool-arguments-type" in finding.reason


def test_choice_without_index() -> None:
    chunk = {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}
    (finding,) = _failed(_sse(chunk, _chunk({}, "stop")))
    assert "choice-index" in finding.reason and finding.reason.startswith("event 1 ")


def test_done_without_finish_reason() -> None:
    (finding,) = _failed(_sse(_chunk({"content": "hi"}), _chunk({"content": "!"})))
    assert "finish-reason-missing" in finding.reason and "event 2" in finding.reason


def test_cut_short_stream_is_not_a_format_violation() -> None:
    # No [DONE] and no finish_reason: truncated-stream's case, unfinished arguments included.
    text = _sse(_chunk({"role": "assistant"}), _calls(FIRST), _calls(_args('{"a":')), done=False)
    assert _failed(text) == []


def test_content_and_tool_calls_in_one_delta_are_allowed() -> None:
    both = _chunk(
        {
            "content": "Checking.",
            "tool_calls": [{**FIRST, "function": {"name": "get_weather", "arguments": "{}"}}],
        }
    )
    assert _failed(_good(both)) == []


def test_violations_are_bounded() -> None:
    chunks = [{"choices": [{"delta": {"content": "x"}}]} for _ in range(MAX_VIOLATIONS + 30)]
    findings = _failed(_sse(*chunks, _chunk({}, "stop")))
    assert len(findings) == MAX_VIOLATIONS + 1
    assert "30 more malformed deltas" in findings[-1].reason
