"""Redaction: secrets never survive capture; markers hash them so captures can be compared."""

from __future__ import annotations

import hashlib
import json

import pytest

from triage.capture import (
    CaptureError,
    parse_curl,
    parse_har,
    parse_jsonl,
    parse_pair,
    redact_headers,
    redact_json,
    redact_text,
    redact_url,
    redaction_marker,
)

SECRET = "sk-canary-1234567890abcdefXYZ"
OK = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'


def test_marker_is_a_keyed_fingerprint_stable_within_the_installation():
    marker = redaction_marker(SECRET)
    assert marker.startswith("[REDACTED:hmac:") and marker.endswith("]")
    assert redaction_marker(SECRET) == marker
    assert redaction_marker(SECRET + "x") != marker
    # not the unsalted hash a reader of the knowledge base could recompute from a guess
    assert hashlib.sha256(SECRET.encode()).hexdigest()[:8] not in marker


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "proxy-authorization",
        "API-Key",
        "x-api-key",
        "Cookie",
        "Set-Cookie",
        "X-Auth-Token",
        "x-goog-api-key",
        "X-Session-Token",
        "cf-access-client-secret",
    ],
)
def test_sensitive_headers(name):
    headers = redact_headers([(name, f"Bearer {SECRET}"), ("Content-Type", "application/json")])
    assert SECRET not in json.dumps(headers)
    assert headers["content-type"] == "application/json"
    assert "[REDACTED:hmac:" in headers[name.lower()]


def test_authorization_keeps_its_scheme():
    headers = redact_headers({"Authorization": f"Bearer {SECRET}"})
    assert headers["authorization"] == f"Bearer {redaction_marker(SECRET)}"
    # same secret, same marker: two captures of one client can be matched
    assert redact_headers({"authorization": f"Bearer {SECRET}"}) == headers


def test_rate_limit_headers_are_not_credentials():
    headers = redact_headers({"x-ratelimit-remaining-tokens": "149984"})
    assert headers == {"x-ratelimit-remaining-tokens": "149984"}


def test_body_fields_at_any_depth():
    body = {
        "model": "gemma",
        "api_key": SECRET,
        "apiKey": "plain-value-1",
        "extra_body": {
            "provider": {"token": "t-0000", "password": "hunter2", "nested": [{"secret": 42}]}
        },
        "metadata": {"access_token": "at", "client_secret": "cs", "Key": "k"},
        "max_tokens": 800,
        "tools": [{"function": {"parameters": {"properties": {"password": {"type": "string"}}}}}],
    }
    redacted = redact_json(body)
    text = json.dumps(redacted)
    for value in (SECRET, "plain-value-1", "t-0000", "hunter2", '"at"', '"cs"', '"k"'):
        assert value not in text
    assert redacted["extra_body"]["provider"]["nested"][0]["secret"].startswith("[REDACTED")
    assert redacted["max_tokens"] == 800
    # a schema that *describes* a password field is not a secret
    props = redacted["tools"][0]["function"]["parameters"]["properties"]
    assert props["password"] == {"type": "string"}
    assert body["api_key"] == SECRET  # the input is not modified


def test_logprob_tokens_are_not_mistaken_for_secrets():
    response = {"choices": [{"logprobs": {"content": [{"token": "Hello", "logprob": -0.1}]}}]}
    assert redact_json(response) == response


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"my key is {SECRET} ok", SECRET),
        ("Authorization: Bearer abcdef0123456789", "abcdef0123456789"),
        ("basic: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ("export OPENAI_API_KEY=abc123def456", "abc123def456"),
        ('{"password": "correct-horse"}', "correct-horse"),
        ("token: ghp_0123456789abcdefghijklmnop", "ghp_0123456789abcdefghijklmnop"),
        ("aws AKIAABCDEFGHIJKLMNOP here", "AKIAABCDEFGHIJKLMNOP"),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl",
            "eyJhbGciOiJIUzI1NiJ9",
        ),
        ("hf_abcdefghijklmnopqrstuvwxyz0123", "hf_abcdefghijklmnopqrstuvwxyz0123"),
    ],
)
def test_text_scrubbing(text, secret):
    assert secret not in redact_text(text)
    assert "[REDACTED:hmac:" in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "The key: understand the question before answering.",
        "use scikit-learn and a task-specific model",
        "max_tokens: 800, tokens: 12",
        "The model produced output that does not match the expected peg-gemma4 format",
        "<|tool_call>call:get_weather{location:Paris}<tool_call|>",
    ],
)
def test_prose_survives(text):
    assert redact_text(text) == text


def test_redaction_is_idempotent():
    once = redact_text(f"Bearer {SECRET} and api_key={SECRET}")
    assert redact_text(once) == once
    assert redact_json(redact_json({"api_key": SECRET})) == redact_json({"api_key": SECRET})


def test_urls():
    url = f"https://user:pa55word@host/v1/chat/completions?api_key={SECRET}&model=gemma&key=abc"
    redacted = redact_url(url)
    assert "pa55word" not in redacted and SECRET not in redacted and "key=abc" not in redacted
    assert "model=gemma" in redacted
    assert redacted.startswith("https://user:[REDACTED:hmac:")


def test_curl_capture_holds_no_secret():
    command = (
        f"curl 'http://h/v1/chat/completions?token={SECRET}' -H 'Authorization: Bearer {SECRET}' "
        f'-H \'x-api-key: {SECRET}\' -d \'{{"api_key": "{SECRET}", "messages": '
        f'[{{"role": "user", "content": "key {SECRET}"}}]}}\''
    )
    exchange = parse_curl(command, OK, file="c.sh")
    assert SECRET not in json.dumps(exchange.to_dict())


def test_har_capture_holds_no_secret():
    entry = {
        "request": {
            "method": "POST",
            "url": f"http://h/v1/chat/completions?api-key={SECRET}",
            "headers": [{"name": "Authorization", "value": f"Bearer {SECRET}"}],
            "cookies": [{"name": "sid", "value": SECRET}],
            "postData": {"text": json.dumps({"secret": SECRET, "messages": []})},
        },
        "response": {
            "status": 200,
            "headers": [{"name": "Set-Cookie", "value": f"sid={SECRET}"}],
            "content": {"text": OK},
        },
    }
    har = json.dumps({"log": {"version": "1.2", "entries": [entry]}})
    exchange = parse_har(har, file="a.har")[0]
    assert SECRET not in json.dumps(exchange.to_dict())


def test_error_messages_never_echo_secrets():
    with pytest.raises(CaptureError) as info:
        parse_jsonl(f'{{"request": {{}}, "response": "{SECRET} is not a body"}}', file="l")
    assert SECRET not in str(info.value)
    error = parse_pair("{}", f'{{"error": "bad key {SECRET}"}}', file="r").error
    assert error is not None and SECRET not in error["message"]


def test_response_text_is_scrubbed():
    exchange = parse_pair(
        "{}", f"HTTP/1.1 401 Unauthorized\r\n\r\nbad token Bearer {SECRET}", file="r"
    )
    assert exchange.status == 401
    assert SECRET not in (exchange.response_text or "")
