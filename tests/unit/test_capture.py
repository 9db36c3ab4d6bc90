"""triage.capture: every input format, detection, transport facts and the clear errors."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from triage import capture
from triage.capture import (
    CaptureError,
    Exchange,
    detect_format,
    exchange_from_http,
    load_file,
    parse,
    parse_curl,
    parse_har,
    parse_jsonl,
    parse_pair,
    parse_pair_document,
    parse_sse,
    validate_exchange,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
REAL = FIXTURES / "real"

PEG_MESSAGE = "The model produced output that does not match the expected peg-gemma4 format"


def message(exchange: Exchange, index: int = 0) -> dict:
    assert exchange.response is not None
    return exchange.response["choices"][index]["message"]


def finish(exchange: Exchange, index: int = 0) -> str | None:
    assert exchange.response is not None
    return exchange.response["choices"][index]["finish_reason"]


def assert_valid(exchange: Exchange) -> None:
    assert validate_exchange(exchange.to_dict()) == []
    assert len(exchange.sha256) == 64


def test_public_surface():
    for name in capture.__all__:
        assert hasattr(capture, name), name
    assert {"pair", "curl", "sse", "har", "jsonl"} <= set(capture.FORMATS)  # plugins add more


# ---------------------------------------------------------------------------- pair


def test_pair_from_real_files():
    ex = load_file(
        REAL / "budget-greedy.request.json", response=REAL / "budget-greedy.response.json"
    )[0]
    assert_valid(ex)
    assert ex.source_format == "pair"
    assert ex.source_file == "budget-greedy.response.json"
    assert ex.request["max_tokens"] == 800
    assert message(ex)["content"] == ""
    assert len(message(ex)["reasoning_content"]) == 2822
    assert finish(ex) == "length"
    assert ex.response["usage"]["completion_tokens"] == 800
    assert ex.response["timings"]["draft_n"] > 0
    raw = (REAL / "budget-greedy.request.json").read_bytes() + b"\0"
    raw += (REAL / "budget-greedy.response.json").read_bytes()
    assert ex.sha256 == hashlib.sha256(raw).hexdigest()


def test_pair_document_with_transport_facts():
    ex = parse_pair_document((FIXTURES / "tool-args-invalid-json.json").read_bytes(), file="x.json")
    assert_valid(ex)
    assert ex.status == 200
    assert ex.elapsed_ms == 1830.5
    assert ex.source_file == "x.json"
    assert ex.request["tools"][0]["function"]["name"] == "get_weather"


def test_pair_verbose_response_keeps_raw_text():
    request = json.dumps({"messages": [{"role": "user", "content": "hi"}], "verbose": True})
    response = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": ""},
                }
            ],
            "__verbose": {
                "content": "<|channel>thought\nhm",
                "tokens_predicted": 60,
                "stop_type": "limit",
            },
        }
    )
    ex = parse_pair(request, response, file="r.json")
    assert ex.response["__verbose"]["content"].startswith("<|channel>thought")


def test_pair_http_error_body_sets_status_from_code():
    ex = load_file(REAL / "bad-request.request.json", response=REAL / "bad-request.response.json")[
        0
    ]
    assert_valid(ex)
    assert ex.status == 400
    assert ex.error == {
        "message": "Expected 'messages' to be an array",
        "type": "invalid_request_error",
        "code": 400,
        "in_stream": False,
    }


def test_response_only_is_accepted_with_empty_request():
    ex = parse((REAL / "toolcall-leak-seed2.response.json").read_bytes(), file="leak.json")[0]
    assert ex.request == {}
    assert "<|tool_call>" in message(ex)["reasoning_content"]


def test_text_completion_choices_are_accepted():
    ex = parse_pair(None, '{"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}')
    assert ex.response["choices"][0]["text"] == "hi"


# ---------------------------------------------------------------------------- curl


def test_curl_with_body_file_and_curl_i_response():
    ex = load_file(
        FIXTURES / "peg-gemma4-500.curl", response=FIXTURES / "peg-gemma4-500.response.txt"
    )[0]
    assert_valid(ex)
    assert ex.source_format == "curl"
    assert ex.method == "POST"
    assert ex.url == "http://127.0.0.1:8080/v1/chat/completions"
    assert ex.status == 500
    assert ex.error["message"] == PEG_MESSAGE
    assert ex.response_headers["server"] == "llama.cpp"
    assert ex.request_headers["authorization"].startswith("Bearer [REDACTED:hmac:")
    assert ex.request["tools"][1]["function"]["name"] == "read_file"


def test_curl_transcript_with_output_after_the_command():
    ex = load_file(FIXTURES / "thinking-budget-transcript.curl")[0]
    assert_valid(ex)
    assert ex.request["max_tokens"] == 800
    assert finish(ex) == "length"
    assert message(ex)["content"] == ""


def test_curl_timeout_message_marks_timed_out():
    ex = load_file(FIXTURES / "timeout.curl")[0]
    assert ex.timed_out is True
    assert ex.response is None
    assert ex.request["max_tokens"] == 4096


@pytest.mark.parametrize(
    "command",
    [
        "curl http://h/v1/chat/completions -d '{\"messages\": []}'",
        "curl http://h/v1/chat/completions --data '{\"messages\": []}'",
        "curl http://h/v1/chat/completions --data-raw='{\"messages\": []}'",
        "curl http://h/v1/chat/completions --data-binary '{\"messages\": []}'",
        "curl http://h/v1/chat/completions --json '{\"messages\": []}'",
        "curl -sSXPOST http://h/v1/chat/completions -d'{\"messages\": []}'",
        "curl -X POST -H 'Content-Type: application/json' \\\n"
        "  http://h/v1/chat/completions \\\n  -d '{\"messages\": []}'",
        "curl -X POST -H 'Content-Type: application/json' \\\r\n"
        "  http://h/v1/chat/completions \\\r\n  -d '{\"messages\": []}'",
        "$ curl --url http://h/v1/chat/completions -d '{\n  \"messages\": []\n}'",
        "/usr/bin/curl -d '{\"messages\": []}' -- http://h/v1/chat/completions",
    ],
)
def test_curl_option_forms(command):
    response = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'
    ex = parse_curl(command, response, file="c.sh")
    assert ex.request == {"messages": []}
    assert ex.url == "http://h/v1/chat/completions"
    assert ex.method == "POST"


def test_curl_user_and_bearer_options_become_redacted_headers():
    command = (
        "curl -u alice:hunter2secret --oauth2-bearer tok_0123456789abcdef "
        "-b 'sid=abcdef123456' http://h/v1/chat/completions -d '{}'"
    )
    ex = parse_curl(command, '{"choices": [{"message": {"content": "x"}}]}', file="c.sh")
    dumped = json.dumps(ex.to_dict())
    assert "hunter2" not in dumped
    assert "tok_0123456789abcdef" not in dumped
    assert "abcdef123456" not in dumped
    assert ex.request_headers["cookie"].startswith("[REDACTED:hmac:")


def test_curl_body_file_relative_to_the_capture(tmp_path):
    (tmp_path / "body.json").write_text('{"messages": [{"role": "user", "content": "x"}]}')
    (tmp_path / "cmd.sh").write_text("curl http://h/v1/chat/completions -d @body.json\n")
    (tmp_path / "out.json").write_text('{"choices": [{"message": {"content": "y"}}]}')
    ex = load_file(tmp_path / "cmd.sh", response=tmp_path / "out.json")[0]
    assert ex.request["messages"][0]["content"] == "x"


def test_curl_sse_response_file():
    command = "curl -N http://h/v1/chat/completions -d '{\"stream\": true}'"
    sse = (REAL / "toolcall-ok-seed1.response.sse").read_bytes()
    ex = parse_curl(command, sse, file="c.sh")
    assert ex.stream is True
    assert finish(ex) == "tool_calls"


@pytest.mark.parametrize(
    ("command", "response", "fragment", "location"),
    [
        ("curl http://h/v1/chat/completions -H 'A: b'", "{}", "no request body", 1),
        ("\n\ncurl http://h -d '{bad'", "{}", "request body (-d) is not JSON", 3),
        ("wget http://h", "{}", "not a curl command", 1),
        ('curl http://h -d \'{"a": 1}', "{}", "No closing quotation", 1),
        ("curl http://h -d @-", "{}", "stdin", 1),
        ("curl http://h -d @body.json", "{}", "read from a file", 1),
        (
            "curl http://h -d '[1, 2]'",
            "{}",
            "request must be a JSON object",
            "line 1, request body",
        ),
        ("curl http://h -d '{}'", None, "no response", None),
        ("curl http://h -H", "{}", "has no value", 1),
    ],
)
def test_curl_errors(command, response, fragment, location):
    with pytest.raises(CaptureError) as info:
        parse_curl(command, response, file="c.sh")
    assert fragment in str(info.value)
    assert info.value.file == "c.sh"
    assert info.value.location == location


# ---------------------------------------------------------------------------- SSE


def test_sse_real_stream_matches_the_non_streamed_reply():
    streamed = parse_sse((REAL / "toolcall-leak-seed2.response.sse").read_bytes(), file="s.sse")
    plain = parse_pair(None, (REAL / "toolcall-leak-seed2.response.json").read_bytes())
    assert_valid(streamed)
    assert streamed.stream is True and streamed.truncated is False
    assert message(streamed)["reasoning_content"] == message(plain)["reasoning_content"]
    assert message(streamed)["content"] == ""
    assert finish(streamed) == finish(plain) == "stop"
    assert streamed.response["timings"]["predicted_n"] > 0


def test_sse_real_tool_call_deltas_and_usage():
    ex = parse_sse((REAL / "toolcall-ok-seed1.response.sse").read_bytes(), file="s.sse")
    plain = parse_pair(None, (REAL / "toolcall-ok-seed1.response.json").read_bytes())
    calls = message(ex)["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == json.loads(
        message(plain)["tool_calls"][0]["function"]["arguments"]
    )
    budget = parse_sse((REAL / "budget-greedy-120.response.sse").read_bytes(), file="b.sse")
    assert budget.response["usage"]["completion_tokens"] == 120
    assert finish(budget) == "length"


def test_sse_parallel_tool_calls_merged_by_index():
    ex = parse_sse(
        (FIXTURES / "stream-tool-deltas.sse").read_bytes(),
        file="t.sse",
        request=(FIXTURES / "stream-tool-deltas.request.json").read_bytes(),
    )
    assert_valid(ex)
    calls = message(ex)["tool_calls"]
    assert [c["id"] for c in calls] == ["call_Wm3Qd8Zr1Yk", "call_Rf7Tn2Lx9Pq"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"location": "Paris"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"path": "README.md"}
    assert finish(ex) == "tool_calls"
    assert ex.response["usage"]["completion_tokens"] == 57
    assert ex.request["stream_options"] == {"include_usage": True}


def test_sse_mid_stream_error_event():
    ex = parse_sse((FIXTURES / "stream-peg-error.sse").read_bytes(), file="e.sse")
    assert_valid(ex)
    assert ex.error == {
        "message": PEG_MESSAGE,
        "type": "server_error",
        "code": 500,
        "in_stream": True,
    }
    assert ex.status is None  # the stream itself started with 200; the code is the error's
    assert ex.truncated is False
    assert message(ex)["reasoning_content"].startswith("The user wants")


def test_sse_older_bare_error_field():
    ex = parse_sse((FIXTURES / "stream-bare-error.sse").read_bytes(), file="e.sse")
    assert ex.error["message"].startswith("Failed to parse input at pos 57")
    assert ex.error["in_stream"] is True
    assert message(ex)["content"] == "Sure, here"


def test_sse_event_error_form():
    text = 'event: error\ndata: {"type": "error", "error": {"message": "boom", "type": "x"}}\n\n'
    ex = parse_sse(text, file="e.sse")
    assert ex.error["message"] == "boom"
    assert ex.response is None


def test_sse_without_done_or_finish_is_truncated():
    ex = parse_sse((FIXTURES / "stream-truncated.sse").read_bytes(), file="t.sse")
    assert ex.truncated is True
    assert message(ex)["reasoning_content"] == "Let me think about the harbour paragraph. Count"
    assert finish(ex) is None


def test_sse_with_finish_but_no_done_is_complete():
    text = (
        'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    )
    assert parse_sse(text, file="s").truncated is False


def test_sse_lines_without_blank_separators_and_crlf():
    text = (
        'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\r\n'
        'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\r\n'
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n'
        "data: [DONE]\r\n"
    )
    ex = parse_sse(text, file="s")
    assert message(ex)["content"] == "ab"
    assert ex.truncated is False


def test_sse_multiple_choices_and_reasoning_alias():
    text = (
        'data: {"choices":[{"index":0,"delta":{"reasoning":"r0"}},'
        '{"index":1,"delta":{"content":"c1"}}]}\n\n'
        'data: {"choices":[{"index":1,"delta":{},"finish_reason":"stop"},'
        '{"index":0,"delta":{"content":"c0"},"finish_reason":"length"}]}\n\n'
        "data: [DONE]\n\n"
    )
    ex = parse_sse(text, file="s")
    assert message(ex, 0) == {"role": "assistant", "content": "c0", "reasoning_content": "r0"}
    assert message(ex, 1)["content"] == "c1"
    assert [finish(ex, 0), finish(ex, 1)] == ["length", "stop"]


def test_sse_with_curl_i_head():
    body = (REAL / "toolcall-ok-seed1.response.sse").read_text()
    text = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: llama.cpp\r\n\r\n" + body
    ex = parse_sse(text, file="s")
    assert ex.status == 200
    assert ex.response_headers["content-type"] == "text/event-stream"


@pytest.mark.parametrize(
    ("text", "fragment", "location"),
    [
        ("data: [DONE]\n\n", "only [DONE]", None),
        ("data: {nope}\n\ndata: [DONE]\n\n", "not JSON", 1),
        ('data: {"choices":[]}\n\ndata: [1]\n\ndata: [DONE]\n\n', "must be a JSON object", 3),
        ("event: ping\n\n", "no data events", None),
        (
            'data: {"content": "x", "stop": false}\n\ndata: [DONE]\n\n',
            "no chat completion chunks",
            None,
        ),
        ("hello\nworld\n", "not an SSE transcript", 1),
    ],
)
def test_sse_errors(text, fragment, location):
    with pytest.raises(CaptureError) as info:
        parse_sse(text, file="s.sse")
    assert fragment in str(info.value)
    assert info.value.location == location


# ---------------------------------------------------------------------------- HAR


def test_har_every_chat_entry():
    exchanges = load_file(FIXTURES / "agent-session.har")
    assert [ex.location for ex in exchanges] == [
        "$.log.entries[1]",
        "$.log.entries[3]",
        "$.log.entries[4]",
    ]
    assert [ex.index for ex in exchanges] == [0, 1, 2]
    for ex in exchanges:
        assert_valid(ex)
        assert ex.source_format == "har"
        assert ex.sha256 == exchanges[0].sha256
    base64_entry, sse_entry, timeout_entry = exchanges
    # base64-encoded JSON body, decoded
    assert finish(base64_entry) == "length"
    assert base64_entry.status == 200
    assert base64_entry.elapsed_ms == 8548.2
    assert base64_entry.http_timings["wait"] == pytest.approx(8546.7)
    # an SSE body in content.text, re-assembled
    assert sse_entry.stream is True
    assert "<|tool_call>" in message(sse_entry)["reasoning_content"]
    # status 0 with the browser's timeout error: no response, timed out
    assert timeout_entry.status is None
    assert timeout_entry.timed_out is True
    assert timeout_entry.response is None
    assert "sk-query" not in (timeout_entry.url or "")


def test_har_without_chat_entries():
    with pytest.raises(CaptureError) as info:
        load_file(FIXTURES / "no-chat.har")
    assert info.value.location == "$.log.entries"
    assert "no POST .../chat/completions entries" in str(info.value)


def _har(entry_overrides: dict) -> str:
    entry = {
        "request": {
            "method": "POST",
            "url": "http://h/v1/chat/completions",
            "headers": [],
            "postData": {"mimeType": "application/json", "text": '{"messages": []}'},
        },
        "response": {
            "status": 200,
            "headers": [],
            "content": {
                "mimeType": "application/json",
                "text": '{"choices": [{"message": {"content": "x"}}]}',
            },
        },
        "time": 5,
    }
    for dotted, value in entry_overrides.items():
        target = entry
        *parents, last = dotted.split(".")
        for key in parents:
            target = target[key]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return json.dumps({"log": {"version": "1.2", "entries": [entry]}})


@pytest.mark.parametrize(
    ("overrides", "location", "fragment"),
    [
        ({"request.postData": None}, "$.log.entries[0].request.postData.text", "no recorded body"),
        (
            {"request.postData": {"text": "{oops"}},
            "$.log.entries[0].request.postData.text",
            "not JSON",
        ),
        (
            {"response.content": {"size": 10}},
            "$.log.entries[0].response.content.text",
            "not recorded",
        ),
        (
            {"response.content": {"text": "!!!", "encoding": "base64"}},
            "$.log.entries[0].response.content.text",
            "base64",
        ),
        ({"response.status": "200"}, "$.log.entries[0].response.status", "integer"),
        (
            {"response.content": {"text": '{"id": "x"}'}},
            "$.log.entries[0].response.content.text",
            "no `choices`",
        ),
    ],
)
def test_har_entry_errors(overrides, location, fragment):
    with pytest.raises(CaptureError) as info:
        parse_har(_har(overrides), file="a.har")
    assert info.value.location == location
    assert fragment in str(info.value)


def test_har_error_status_without_body():
    ex = parse_har(_har({"response.status": 502, "response.content": {"size": 0}}), file="a.har")[0]
    assert ex.status == 502
    assert ex.error["code"] == 502


def test_har_base64_sse():
    sse = (REAL / "toolcall-ok-seed1.response.sse").read_bytes()
    content = {
        "mimeType": "text/event-stream",
        "encoding": "base64",
        "text": base64.b64encode(sse).decode(),
    }
    ex = parse_har(_har({"response.content": content}), file="a.har")[0]
    assert finish(ex) == "tool_calls"


@pytest.mark.parametrize(
    ("text", "location"),
    [('{"entries": []}', "$.log"), ('{"log": {"entries": {}}}', "$.log.entries")],
)
def test_har_structure_errors(text, location):
    with pytest.raises(CaptureError) as info:
        parse_har(text, file="a.har")
    assert info.value.location == location


# ---------------------------------------------------------------------------- JSONL


def test_jsonl_one_exchange_per_line():
    exchanges = load_file(FIXTURES / "exchanges.jsonl")
    assert len(exchanges) == 6
    assert [ex.location for ex in exchanges] == [f"line {n}" for n in range(1, 7)]
    for ex in exchanges:
        assert_valid(ex)
        assert ex.source_format == "jsonl"
    assert exchanges[0].elapsed_ms == 912.0
    assert exchanges[2].status == 500 and exchanges[2].error["message"] == PEG_MESSAGE
    assert exchanges[3].timed_out is True and exchanges[3].response is None
    assert exchanges[3].error is None
    assert exchanges[4].stream is True and message(exchanges[4])["content"] == "Done."


def test_jsonl_skips_blank_lines_and_counts_real_lines():
    line = json.dumps({"request": {}, "response": {"choices": [{"message": {"content": "x"}}]}})
    exchanges = parse_jsonl(f"\n{line}\n\n{line}\n", file="l.jsonl")
    assert [ex.location for ex in exchanges] == ["line 2", "line 4"]
    assert [ex.index for ex in exchanges] == [0, 1]


@pytest.mark.parametrize(
    ("text", "location", "fragment"),
    [
        (
            '{"request": {}, "response": {"choices": [{"text": ""}]}}\n{oops\n',
            2,
            "invalid JSON line",
        ),
        ('{"request": {}, "response": {"choices": []}}\n', "line 1, $.response.choices", "empty"),
        ('{"request": {}}\n', "line 1, $.response", "no `response`"),
        ('{"response": {}}\n', "line 1, $.request", "no `request`"),
        ("[1]\n", 1, "must be a JSON object"),
        ('{"request": {}, "response": {"x": 1}}', "line 1, $.response", "no `choices`"),
        ('{"request": {}, "response": null}', "line 1, $.response", "no response"),
        (
            '{"request": {}, "response": {"choices": [{}]}, "status": "ok"}',
            "line 1, $.status",
            "status",
        ),
        ('{"request": 3, "response": {}}', "line 1, $.request", "request must be a JSON object"),
        ("\n\n", None, "no exchanges"),
    ],
)
def test_jsonl_errors(text, location, fragment):
    with pytest.raises(CaptureError) as info:
        parse_jsonl(text, file="l.jsonl")
    assert info.value.location == location
    assert fragment in str(info.value)


# ---------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("agent-session.har", "har"),
        ("exchanges.jsonl", "jsonl"),
        ("peg-gemma4-500.curl", "curl"),
        ("thinking-budget-transcript.curl", "curl"),
        ("stream-peg-error.sse", "sse"),
        ("stream-bare-error.sse", "sse"),
        ("tool-args-invalid-json.json", "pair"),
        ("peg-gemma4-500.request.json", "request"),
        ("peg-gemma4-500.response.txt", "response"),
        ("real/budget-greedy.response.json", "response"),
    ],
)
def test_detect_format(name, expected):
    assert detect_format((FIXTURES / name).read_bytes(), name) == expected


def test_detect_without_file_names():
    assert detect_format((FIXTURES / "agent-session.har").read_text()) == "har"
    assert detect_format((FIXTURES / "exchanges.jsonl").read_text()) == "jsonl"


def test_parse_auto_routes_every_format():
    for name, count in [
        ("agent-session.har", 3),
        ("exchanges.jsonl", 6),
        ("stream-tool-deltas.sse", 1),
        ("tool-args-schema-violation.json", 1),
        ("thinking-budget-transcript.curl", 1),
    ]:
        assert len(parse((FIXTURES / name).read_bytes(), file=name)) == count


def test_parse_rejects_unknown_format():
    with pytest.raises(CaptureError, match="unknown format"):
        parse("{}", format="xml", file="a")


def test_request_alone_needs_its_response():
    with pytest.raises(CaptureError, match="give its response"):
        parse((FIXTURES / "peg-gemma4-500.request.json").read_bytes(), file="r.json")


# ---------------------------------------------------------------------------- bad input


def test_non_utf8_bytes_name_the_line():
    data = b'{"request": {},\n "response": "caf\xe9"}'
    with pytest.raises(CaptureError) as info:
        parse_pair_document(data, file="bad.json")
    assert info.value.location == 2
    assert "not UTF-8" in str(info.value) and "0xe9" in str(info.value)


def test_wrong_json_names_line_and_column():
    with pytest.raises(CaptureError) as info:
        parse_pair_document('{"request": {},\n  "response": {,}}', file="w.json")
    assert info.value.location == 2
    assert "column" in info.value.message


def test_response_without_choices():
    with pytest.raises(CaptureError) as info:
        parse_pair("{}", '{"id": "chatcmpl-1", "object": "chat.completion"}', file="r.json")
    assert info.value.location == "$"
    assert "no `choices`" in str(info.value)


@pytest.mark.parametrize(
    ("response", "location"),
    [
        ('{"choices": {}}', "$.choices"),
        ('{"choices": [3]}', "$.choices[0]"),
        ('{"choices": [{"index": 0}]}', "$.choices[0].message"),
        ('{"choices": [{"message": {"tool_calls": {}}}]}', "$.choices[0].message.tool_calls"),
    ],
)
def test_malformed_choices(response, location):
    with pytest.raises(CaptureError) as info:
        parse_pair("{}", response, file="r.json")
    assert info.value.location == location


def test_plain_text_error_body_with_status():
    ex = parse_pair("{}", "HTTP/1.1 502 Bad Gateway\r\n\r\n<html>bad gateway</html>", file="r")
    assert ex.status == 502
    assert ex.response_text == "<html>bad gateway</html>"
    with pytest.raises(CaptureError, match="neither JSON nor an SSE stream"):
        parse_pair("{}", "<html>ok?</html>", file="r")


def test_nan_and_deep_nesting_are_refused():
    with pytest.raises(CaptureError, match="NaN"):
        parse_pair("{}", '{"choices": [{"message": {"content": NaN}}]}', file="r")
    deep = "[" * 150 + "]" * 150
    with pytest.raises(CaptureError, match="nests"):
        parse_pair("{}", '{"choices": [{"message": {"content": ' + deep + "}}]}", file="r")


def test_size_limit(tmp_path, monkeypatch):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as handle:  # sparse: no 32 MiB written to disk
        handle.truncate(capture.MAX_CAPTURE_BYTES + 1)
    with pytest.raises(CaptureError) as info:
        load_file(big)
    assert "32 MiB" in str(info.value)
    monkeypatch.setattr(capture, "MAX_CAPTURE_BYTES", 10)
    with pytest.raises(CaptureError, match="limit"):
        parse_jsonl(b"x" * 11, file="b")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CaptureError, match="cannot open"):
        load_file(tmp_path / "nope.json")
    with pytest.raises(CaptureError, match="directory"):
        load_file(tmp_path)


def test_capture_error_str_forms():
    assert str(CaptureError("f", 3, "m")) == "f:3: m"
    assert str(CaptureError("f", "$.a", "m")) == "f: $.a: m"
    assert str(CaptureError("f", None, "m")) == "f: m"


# ---------------------------------------------------------------------------- dict form


def test_to_dict_round_trip_and_schema():
    ex = load_file(FIXTURES / "agent-session.har")[1]
    data = json.loads(json.dumps(ex.to_dict()))
    assert Exchange.from_dict(data) == ex
    data["source_format"] = "telnet"
    assert validate_exchange(data)[0][0] == "$.source_format"
    with pytest.raises(CaptureError):
        Exchange.from_dict(data)


def test_exchange_from_http_for_probe_replies():
    request = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 800}
    body = json.loads((REAL / "budget-greedy.response.json").read_text())
    ex = exchange_from_http(request, body, status=200, elapsed_ms=8548.0)
    assert ex.source_format == "live"
    assert ex.status == 200 and ex.elapsed_ms == 8548.0
    assert finish(ex) == "length"
    streamed = exchange_from_http(
        request, (REAL / "budget-greedy-120.response.sse").read_bytes(), status=200
    )
    assert streamed.stream is True
    timed_out = exchange_from_http(request, None, timed_out=True, elapsed_ms=1.0)
    assert timed_out.timed_out and timed_out.response is None
    error = exchange_from_http(
        request, {"error": {"code": 500, "message": PEG_MESSAGE}}, status=500
    )
    assert error.error["message"] == PEG_MESSAGE
