"""A capture of several exchanges read as a conversation (triage/capture/conversation.py,
triage/checks/prompt_cache_turns.py): which exchange `triage diagnose` diagnoses, which
earlier exchanges are its turns, and the unstable-prefix finding read from them -- from a
HAR, a JSONL log and the proxy's journal -- and hostile captures refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from triage.capture import CaptureError, PartialCapture, load_file
from triage.capture import model as capture_model
from triage.capture.conversation import MAX_EXCHANGES, read_conversation
from triage.checks.prompt_cache_turns import conversation_intake
from triage.cli import cli
from triage.proxy.journal import encode_record
from triage.symptoms import is_failure

POLICY = "House policy: answer briefly and politely, cite nothing, never guess. " * 20


def _request(turn: int, *, stamp_first: bool = True, question: str = "Where is it?") -> Any:
    """Turn `turn` (0-based) of a conversation: the system prompt, `turn` earlier
    question/answer pairs, the new question."""
    stamp = f"Current time: 2026-12-01T17:0{turn}:07Z."
    system = f"{stamp} {POLICY}" if stamp_first else f"{POLICY} {stamp}"
    messages: list[Any] = [{"role": "system", "content": system}]
    for earlier in range(turn):
        messages.append({"role": "user", "content": f"question {earlier}: {question}"})
        messages.append({"role": "assistant", "content": f"answer {earlier}"})
    messages.append({"role": "user", "content": f"question {turn}: {question}"})
    return {"model": "m", "messages": messages, "max_tokens": 32}


def _reply(content: str, cache_n: int | None = None, prompt_n: int = 400) -> Any:
    reply: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ]
    }
    if cache_n is not None:
        reply["timings"] = {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": 150.5}
    return reply


def _records(turns: int, *, stamp_first: bool = True, timings: bool = True) -> list[Any]:
    return [
        {
            "request": _request(t, stamp_first=stamp_first),
            "response": _reply(f"It is in Paris ({t}).", 11 if timings else None),
            "status": 200,
        }
        for t in range(turns)
    ]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def _har(path: Path, records: list[Any]) -> Path:
    entries = []
    for record in records:
        body = json.dumps(record["response"])
        entries.append(
            {
                "startedDateTime": "2026-12-01T17:00:00Z",
                "time": 120,
                "request": {
                    "method": "POST",
                    "url": "http://127.0.0.1:8080/v1/chat/completions",
                    "headers": [{"name": "content-type", "value": "application/json"}],
                    "postData": {
                        "mimeType": "application/json",
                        "text": json.dumps(record["request"]),
                    },
                },
                "response": {
                    "status": record.get("status", 200),
                    "headers": [{"name": "content-type", "value": "application/json"}],
                    "content": {"mimeType": "application/json", "text": body},
                },
            }
        )
    path.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}), "utf-8")
    return path


def _intake(path: Path, pick: int | None = None) -> Any:
    return conversation_intake(load_file(path), file=str(path), pick=pick, failed=is_failure)


def test_a_timestamp_first_in_a_har_session_is_a_failed_finding_with_the_shared_prefixes(
    tmp_path: Path,
) -> None:
    intake = _intake(_har(tmp_path / "session.har", _records(5)))
    assert intake.conversation.chosen == 4  # nothing fails: the last exchange
    assert intake.conversation.turns == (0, 1, 2, 3, 4)
    finding = intake.finding
    assert finding is not None and not finding.passed and finding.kind == "unstable-prefix"
    # "Current time: 2026-12-01T17:0" is 29 characters; then the minute differs.
    assert finding.where == "$.request.messages[0].content" and finding.offset == 29
    assert finding.score == 1.0
    # The shared prefix: "<system>" (the role, 8 characters) and those 29 characters.
    assert "37/1474*, 37/1523*, 37/1572*, 37/1621*" in finding.reason
    assert "4 of 4 consecutive turns" in finding.reason
    # The replies' own timings are quoted as evidence, per turn.
    assert "timings.cache_n/prompt tokens): 11/411 (150 ms), 11/411" in finding.reason
    assert "$.log.entries[4]" in finding.reason
    assert any("diagnosing exchange 5 ($.log.entries[4])" in note for note in intake.notes)


def test_a_stable_prefix_in_a_jsonl_log_is_a_passed_finding_quoting_the_timings(
    tmp_path: Path,
) -> None:
    intake = _intake(_jsonl(tmp_path / "log.jsonl", _records(4, stamp_first=False)))
    finding = intake.finding
    assert finding is not None and finding.passed
    assert "every measured pair shares at least half" in finding.reason
    assert "11/411 (150 ms)" in finding.reason
    assert "(exchanges 1, 2, 3, 4)" in finding.reason


def test_replies_without_timings_still_give_the_prefix_reading(tmp_path: Path) -> None:
    intake = _intake(_jsonl(tmp_path / "log.jsonl", _records(3, timings=False)))
    assert intake.finding is not None and not intake.finding.passed
    assert "the replies carry no timings.cache_n" in intake.finding.reason


def test_the_failing_exchange_is_diagnosed_and_other_conversations_are_not_its_turns(
    tmp_path: Path,
) -> None:
    records = _records(3)
    other = {  # another conversation in the same log, between the turns
        "request": {"messages": [{"role": "user", "content": "Write a title for this chat"}]},
        "response": _reply("A title"),
    }
    failing = {"request": _request(3), "response": _reply(""), "status": 200}  # empty reply
    later = {
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": _reply("hey"),
    }
    path = _jsonl(
        tmp_path / "log.jsonl", [records[0], other, records[1], records[2], failing, later]
    )
    intake = _intake(path)
    assert intake.conversation.chosen == 4
    assert intake.conversation.reason == "the last exchange whose reply fails"
    assert intake.conversation.turns == (0, 2, 3, 4)
    # Chosen by number, from 1; the title request is a conversation of one.
    assert _intake(path, pick=2).conversation.turns == (1,)
    assert _intake(path, pick=2).finding is None
    assert _intake(path, pick=6).conversation.chosen == 5


def test_a_position_outside_the_capture_names_the_file_and_the_range(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "log.jsonl", _records(3))
    with pytest.raises(CaptureError, match=r"log\.jsonl: --exchange 7: .*3 exchanges \(1 to 3\)"):
        _intake(path, pick=7)


def test_one_exchange_is_diagnosed_as_before_without_a_conversation_finding(
    tmp_path: Path,
) -> None:
    intake = _intake(_jsonl(tmp_path / "one.jsonl", _records(4)[3:]))
    assert intake.finding is None and intake.notes == ()
    assert intake.exchange.request == _request(3)


def test_too_many_exchanges_are_refused_naming_the_file(tmp_path: Path) -> None:
    exchange = load_file(_jsonl(tmp_path / "log.jsonl", _records(1)))[0]
    with pytest.raises(CaptureError, match=rf"big\.jsonl: holds {MAX_EXCHANGES + 1} exchanges"):
        read_conversation([exchange] * (MAX_EXCHANGES + 1), file="big.jsonl", failed=bool)


def test_a_huge_capture_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _jsonl(tmp_path / "log.jsonl", _records(5))
    monkeypatch.setattr("triage.capture.MAX_CAPTURE_BYTES", 2000)
    with pytest.raises(CaptureError, match=r"log\.jsonl: file is \d+ bytes, over the 2000"):
        load_file(path)


def test_a_deeply_nested_entry_is_refused_naming_the_entry(tmp_path: Path) -> None:
    records = _records(3)
    deep: Any = "x"
    for _ in range(capture_model.MAX_JSON_DEPTH + 5):
        deep = {"a": deep}
    records[1]["request"]["metadata"] = deep
    with pytest.raises(CaptureError, match=r"session\.har: .*deeper than") as caught:
        load_file(_har(tmp_path / "session.har", records))
    assert "entries[1]" in str(caught.value) or "1 of 3" in str(caught.value)
    with pytest.raises(CaptureError, match=r"log\.jsonl:2: .*deeper than"):
        load_file(_jsonl(tmp_path / "log.jsonl", records))


def test_a_long_conversation_of_long_prompts_is_read_and_its_listing_capped(
    tmp_path: Path,
) -> None:
    # 30 turns of 40,000-character prompts (each pair compared by slices, not per character).
    records = []
    for turn in range(30):
        request = _request(turn)
        request["messages"][0]["content"] += "policy " * 6000
        records.append({"request": request, "response": _reply("ok", 5)})
    intake = conversation_intake(
        load_file(_jsonl(tmp_path / "long.jsonl", records)), file="long.jsonl", failed=is_failure
    )
    assert intake.finding is not None and not intake.finding.passed
    assert intake.conversation.turns == tuple(range(30))
    assert "29 of 29 consecutive turns" in intake.finding.reason
    assert "and 18 more" in intake.finding.reason  # 30 turns listed 12 at a time


def _raw_record(number: int, record: Any, path: str = "/v1/chat/completions") -> Any:
    """What the proxy's forwarder hands its journal (triage/proxy/forward.py)."""
    return {
        "key": f"{number:032x}",
        "at": 1796146224.0 + number,
        "method": "POST",
        "path": path,
        "recordable": True,
        "request_body": json.dumps(record["request"]).encode(),
        "request_headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer sk-live-secret-123456789"),
        ],
        "client": "agent/1.0",
        "status": 200,
        "response_headers": [(b"content-type", b"application/json")],
        "response_chunks": [json.dumps(record["response"]).encode()],
        "elapsed_ms": 180.0,
        "ttfb_ms": 170.0,
        "timed_out": False,
        "transport_error": None,
        "client_disconnected": False,
        "body_truncated": False,
        "upstream_truncated": False,
        "stream": False,
        "identity": {},
    }


def _journal(path: Path, records: list[Any]) -> Path:
    frames = [encode_record(_raw_record(n, r)) for n, r in enumerate(records)]
    health = dict(_raw_record(99, records[0], path="/health"), request_body=b"")
    path.write_bytes(frames[0] + encode_record(health) + b"".join(frames[1:]))
    return path


def test_the_proxy_journal_of_a_session_is_read_as_a_conversation(tmp_path: Path) -> None:
    path = _journal(tmp_path / "4242-1796146224-0.journal", _records(4))
    exchanges = load_file(path)
    assert len(exchanges) == 4 and exchanges[0].location == "record 0 (byte 0)"
    assert exchanges[1].location.startswith("record 2 (byte ")  # record 1, /health, skipped
    assert "sk-live-secret" not in json.dumps([e.to_dict() for e in exchanges])
    intake = conversation_intake(exchanges, file=str(path), failed=is_failure)
    assert intake.conversation.turns == (0, 1, 2, 3)
    assert intake.finding is not None and not intake.finding.passed
    assert intake.finding.offset == 29
    # Found by its content too, without the suffix.
    plain = tmp_path / "segment"
    plain.write_bytes(path.read_bytes())
    assert len(load_file(plain)) == 4


def test_a_journal_cut_by_a_crash_names_the_record_and_keeps_the_others(tmp_path: Path) -> None:
    path = _journal(tmp_path / "s.journal", _records(3))
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # the last frame torn
    with pytest.raises(PartialCapture, match=r"s\.journal: record 3 \(byte \d+\): a frame of") as c:
        load_file(path)
    assert len(c.value.good) == 2
    flipped = bytearray(data)
    flipped[20] ^= 0xFF  # a byte of the first payload
    path.write_bytes(bytes(flipped))
    with pytest.raises(CaptureError, match=r"record 0 \(byte 0\): the frame's checksum"):
        load_file(path)
    path.write_bytes(b"\x00\x00\x10\x00garbage")
    with pytest.raises(CaptureError, match=r"s\.journal: record 0 \(byte 0\)"):
        load_file(path)


def test_diagnose_names_the_file_and_the_range_of_a_bad_exchange_number(tmp_path: Path) -> None:
    capture = _jsonl(tmp_path / "session.jsonl", _records(3))
    stack = tmp_path / "stack.toml"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    stack.write_text('[server]\nmodel = "m.gguf"\n')
    env = {
        "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}",
        "TRIAGE_HOME": str(tmp_path / "home"),
    }
    args = ["diagnose", "--request", str(capture), "--stack", str(stack), "--exchange", "4"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{capture}: --exchange 4: the capture holds 3 exchanges (1 to 3)" in result.output
    zero = CliRunner().invoke(cli, [*args[:-1], "0"], env=env)
    assert zero.exit_code == 2 and "0 is not in the range x>=1" in zero.output


def test_odd_message_shapes_are_grouped_by_structure_without_error(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "Where is it?"}]  # content as parts, as vision clients send
    first = {"messages": [{"role": "user", "content": parts}]}
    second = {
        "messages": [
            {"role": "user", "content": parts},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "user", "content": "and now?"},
        ]
    }
    other = {"messages": [{"role": "user", "content": [{"type": "text", "text": "else"}]}]}
    prompt = {"prompt": "Once upon a time", "n_predict": 8}
    records = [
        {"request": first, "response": _reply("Paris")},
        {"request": other, "response": _reply("x")},
        {"request": prompt, "response": _reply("y")},
        {"request": second, "response": _reply("Still Paris")},
    ]
    intake = _intake(_jsonl(tmp_path / "odd.jsonl", records))
    assert intake.conversation.turns == (0, 3)
    # Two short turns: measured, nothing worth caching to lose -- a passed finding.
    assert intake.finding is not None and intake.finding.passed
    assert "no earlier prompt reaches 1000 characters" in intake.finding.reason


def test_a_journal_record_that_is_not_a_chat_request_is_named(tmp_path: Path) -> None:
    records = _records(2)
    bad = dict(_raw_record(1, records[1]), request_body=b"{not json")
    path = tmp_path / "s.journal"
    path.write_bytes(encode_record(_raw_record(0, records[0])) + encode_record(bad))
    with pytest.raises(
        PartialCapture, match=r"s\.journal: record 1 \(byte \d+\), \$\.request_body: not a JSON"
    ) as caught:
        load_file(path)
    assert len(caught.value.good) == 1
    path.write_bytes(encode_record(dict(_raw_record(0, records[0]), path="/v1/models")))
    with pytest.raises(CaptureError, match=r"s\.journal: the journal has no chat"):
        load_file(path)
