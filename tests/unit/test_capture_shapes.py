"""Capture shapes from issue 17: `curl -v` transcripts, gateway-style JSONL records, and
`--exchange N` to pick one exchange of a multi-exchange capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from triage.capture import CaptureError, detect_format, load_file, parse
from triage.cli import cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
KEY = "sk-local-0123456789abcdef"
COMMAND = (
    "$ curl -v http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' "
    f"-H 'Authorization: Bearer {KEY}' "
    '-d \'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}\'\n'
)
TRANSCRIPT = f"""Note: Unnecessary use of -X or --request, POST is already inferred.
*   Trying 127.0.0.1:8080...
* Connected to 127.0.0.1 (127.0.0.1) port 8080 (#0)
> POST /v1/chat/completions HTTP/1.1
> Host: 127.0.0.1:8080
> User-Agent: curl/7.88.1
> Authorization: Bearer {KEY}
> Content-Type: application/json
>
< HTTP/1.1 200 OK
< Server: llama.cpp
< Content-Type: application/json; charset=utf-8
<
{{"choices":[{{"finish_reason":"length","index":0,"message":{{"role":"assistant","content":""}}}}]}}
* Connection #0 to host 127.0.0.1 left intact
"""


def test_curl_command_with_its_verbose_output():
    text = COMMAND + TRANSCRIPT
    assert detect_format(text, "x.txt") == "curl"
    ex = parse(text, file="v.curl")[0]
    assert ex.request["messages"][0]["content"] == "hi"
    assert ex.status == 200
    assert ex.response["choices"][0]["finish_reason"] == "length"
    assert ex.response_headers["server"] == "llama.cpp"
    assert KEY not in json.dumps(ex.to_dict())


def test_verbose_transcript_alone():
    assert detect_format(TRANSCRIPT, "x.txt") == "curl"
    ex = parse(TRANSCRIPT, file="v.txt")[0]
    assert ex.url == "http://127.0.0.1:8080/v1/chat/completions"
    assert ex.method == "POST"
    assert ex.request == {}  # curl -v does not print the request body
    assert ex.request_headers["user-agent"] == "curl/7.88.1"
    assert ex.status == 200
    assert KEY not in json.dumps(ex.to_dict())


def test_verbose_streamed_reply_and_an_error_status():
    stream = TRANSCRIPT.replace("application/json; charset=utf-8", "text/event-stream").replace(
        '{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant",'
        '"content":""}}]}',
        'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
        "data: [DONE]\n",
    )
    ex = parse(COMMAND + stream, file="s.curl")[0]
    assert ex.stream and ex.response["choices"][0]["message"]["content"] == "Hello"
    failing = TRANSCRIPT.replace("200 OK", "500 Internal Server Error").replace(
        TRANSCRIPT.splitlines()[13], '{"error": {"code": 500, "message": "Failed to parse input"}}'
    )
    ex = parse(COMMAND + failing, file="e.curl")[0]
    assert ex.status == 500 and ex.error["message"] == "Failed to parse input"


def test_verbose_body_error_names_the_transcript_line():
    broken = TRANSCRIPT.replace('"content":""}}]}', '"content":""}}]')
    with pytest.raises(CaptureError) as info:
        parse(COMMAND + broken, file="b.curl")
    assert info.value.location == 15  # command line 1, transcript line 14 -> file line 15


GATEWAY = [
    {
        "request": {
            "method": "POST",
            "url": "https://gw.example/v1/chat/completions",
            "headers": [{"name": "Ocp-Apim-Subscription-Key", "value": "gw-key-0123456789"}],
            "body": json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}),
        },
        "response": {
            "status": 200,
            "headers": {"content-type": "application/json"},
            "body": {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                  "finish_reason": "length"}]},
        },
    },
    {
        "request": {"headers": {"x-api-key": "gw-key-0123456789"}, "body": {"messages": []}},
        "response": {"status_code": 502, "body": "<html>Bad Gateway</html>"},
    },
    {
        "request": {"body": {"messages": []}},
        "response": {"statusCode": 200, "body": json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )},
    },
]  # fmt: skip


def test_gateway_jsonl_records():
    text = "\n".join(json.dumps(record) for record in GATEWAY) + "\n"
    exchanges = parse(text, file="gateway.jsonl")
    assert [ex.status for ex in exchanges] == [200, 502, 200]
    first, second, third = exchanges
    assert first.request["messages"][0]["content"] == "a"
    assert first.url == "https://gw.example/v1/chat/completions" and first.method == "POST"
    assert first.response["choices"][0]["finish_reason"] == "length"
    assert first.response_headers == {"content-type": "application/json"}
    assert second.error["code"] == 502 and "Bad Gateway" in second.response_text
    assert third.response["choices"][0]["message"]["content"] == "ok"
    assert "gw-key-0123456789" not in json.dumps([ex.to_dict() for ex in exchanges])


def test_gateway_record_with_a_request_body_that_is_not_json():
    record = {"request": {"headers": {}, "body": "{nope"}, "response": {"status": 200, "body": {}}}
    with pytest.raises(CaptureError) as info:
        parse(json.dumps(record) + "\n" + json.dumps(GATEWAY[2]) + "\n", file="g.jsonl")
    assert info.value.location == "line 1, $.request.body"


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_exchange_option_picks_one_exchange(tmp_path):
    har = FIXTURES / "agent-session.har"
    everything = json.loads(run("check", "--json", har).stdout)
    assert len(everything) >= 2
    second = run("check", "--json", "--exchange", 2, har)
    assert second.exit_code == 0
    assert json.loads(second.stdout) == [everything[1]]
    out_of_range = run("check", "--exchange", len(everything) + 1, har)
    assert out_of_range.exit_code == 1
    assert f"holds {len(everything)} exchange(s)" in out_of_range.stderr
    assert run("check", "--exchange", 0, har).exit_code == 2


def test_capture_stores_only_the_picked_exchange(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DATABASE_URL", f"sqlite:///{tmp_path / 'kb.db'}")
    path = tmp_path / "gateway.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GATEWAY) + "\n", encoding="utf-8")
    result = run("capture", "--json", "--exchange", 2, path)
    assert result.exit_code == 0, result.output
    stored = json.loads(result.stdout)
    assert len(stored) == 1 and stored[0]["location"] == "line 2" and stored[0]["status"] == 502
    assert load_file(path)[1].status == 502
