"""Redaction gaps of issue 18 (defect 4) and property tests: a generated secret in any
header, body key or free-text position never survives capture; server flags that carry
secrets are masked by `redact_args`."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from triage.capture import (
    exchange_from_record,
    parse_curl,
    parse_pair,
    redact_args,
    redact_headers,
    redact_json,
    redact_text,
)
from triage.capture.redact import is_secret_name

OK = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'


# ------------------------------------------------------------------- the measured defects


def test_cookie_inside_an_error_message():
    text = "upstream refused: Cookie session=s3cr3tCookieValue42; theme=dark (401)"
    redacted = redact_text(text)
    assert "s3cr3tCookieValue42" not in redacted
    assert redacted.startswith("upstream refused: Cookie [REDACTED:")
    error = parse_pair("{}", json.dumps({"error": {"message": text, "code": 401}}), file="r").error
    assert error is not None and "s3cr3tCookieValue42" not in error["message"]


def test_header_name_and_value_without_a_colon():
    assert "Zq81VvJk2m" not in redact_text("curl failed with x-api-key Zq81VvJk2m")
    assert "hunter22" not in redact_text("login with password hunter22 rejected")


def test_short_provider_keys():
    for key in ("sk-a1b2c3", "sk-AbCd", "sk-proj-9x8y", "gsk_" + "a1" * 5):
        assert key not in redact_text(f"key was {key}."), key
    assert redact_text("we use scikit-learn (sk-learn) here") == (
        "we use scikit-learn (sk-learn) here"
    )


def test_subscription_key_header_and_pattern_names():
    headers = redact_headers(
        {
            "Ocp-Apim-Subscription-Key": "0a1b2c3d4e5f",
            "X-My-Secret-Thing": "plainvalue",
            "X-Custom-Auth": "abcdef",
            "X-Ratelimit-Remaining-Tokens": "1499",
            "Content-Type": "application/json",
        }
    )
    assert "0a1b2c3d4e5f" not in json.dumps(headers)
    assert "plainvalue" not in json.dumps(headers)
    assert "abcdef" not in json.dumps(headers)
    assert headers["x-ratelimit-remaining-tokens"] == "1499"
    assert headers["content-type"] == "application/json"


def test_body_keys_auth_and_credentials_pass():
    body = {
        "auth": "Zm9vOmJhcg",
        "credentials": {"user": "bob", "pass": "hunter2"},
        "provider": {"subscriptionKey": "sub-123", "session_token": "st"},
        "max_tokens": 800,
        "timings": {"predicted_per_token_ms": 2.5, "predicted_n": 12},
        "usage": {"completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}},
        "metadata": {"author": "Jane", "keywords": "x"},
    }
    redacted = redact_json(body)
    text = json.dumps(redacted)
    for secret in ("Zm9vOmJhcg", "hunter2", "sub-123", '"st"'):
        assert secret not in text, secret
    assert redacted["credentials"]["user"] == "bob"
    assert redacted["max_tokens"] == 800
    assert redacted["timings"] == body["timings"]
    assert redacted["usage"] == body["usage"]
    assert redacted["metadata"] == body["metadata"]


# ------------------------------------------------------------------- server flags


def test_redact_args_masks_secret_flags_in_both_forms():
    argv = [
        "-m",
        "model.gguf",
        "--api-key",
        "local-key-123",
        "--api-key-file=/etc/llama/keys.txt",
        "--ssl-key-file",
        "/etc/ssl/private/server.key",
        "--hf-token",
        "hf_abcdefghijkl0123",
        "-c",
        "8192",
        "--alias",
        "sk-abcdef123456",
    ]
    masked = redact_args(argv)
    text = " ".join(masked)
    for secret in ("local-key-123", "/etc/llama/keys.txt", "server.key", "hf_abcdefghijkl0123"):
        assert secret not in text
    assert "sk-abcdef123456" not in text  # a key shape in any argument
    assert masked[:2] == ["-m", "model.gguf"] and masked[9:11] == ["-c", "8192"]
    assert masked[2] == "--api-key" and masked[3].startswith("[REDACTED:")
    assert masked[4].startswith("--api-key-file=[REDACTED:")
    assert argv[3] == "local-key-123"  # the caller keeps the real value
    assert redact_args(masked) == masked  # idempotent
    # equal secrets give equal markers: two runs with the same key can be compared
    assert redact_args(["--api-key", "local-key-123"]) == masked[2:4]


# ------------------------------------------------------------------- properties

ALNUM = string.ascii_letters + string.digits
secrets = (
    st.text(alphabet=ALNUM, min_size=8, max_size=40)
    .filter(lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s))
    .map(lambda s: "Q" + s + "9")  # starts with a letter, ends with a digit
)
words = st.from_regex(r"[a-z]{1,8}", fullmatch=True)
SECRET_WORDS = [
    "key", "api-key", "token", "secret", "auth", "password", "subscription-key", "cookie",
    "session", "credential", "access-token",
]  # fmt: skip
header_names = st.one_of(
    st.sampled_from(
        [
            "Authorization",
            "Proxy-Authorization",
            "X-Api-Key",
            "api-key",
            "Ocp-Apim-Subscription-Key",
            "Cookie",
            "Set-Cookie",
            "X-Auth-Token",
            "X-Goog-Api-Key",
            "X-Password",
        ]
    ),
    st.builds(lambda w, s: f"X-{w}-{s}", words, st.sampled_from(SECRET_WORDS)),
    st.builds(lambda s, w: f"{s}-{w}", st.sampled_from(SECRET_WORDS), words),
)
body_names = st.one_of(
    st.sampled_from(["auth", "pass", "pwd", "key", "apiKey", "client_secret", "Authorization"]),
    st.builds(lambda w, s: f"{w}_{s}", words, st.sampled_from(SECRET_WORDS)),
    st.builds(
        lambda w, s: f"{w}{s.title().replace('-', '')}", words, st.sampled_from(SECRET_WORDS)
    ),
)
TEXT_FORMS = [
    "{name}={secret}",
    "{name}: {secret}",
    '"{name}": "{secret}"',
    "{name} {secret}",
    "Cookie {cookie}={secret}",
    "Cookie: {cookie}={secret}; path=/",
    "Authorization: Bearer {secret}",
    "sk-{secret}",
]
text_names = st.sampled_from(
    ["api_key", "x-api-key", "API-KEY", "password", "passwd", "secret", "client_secret",
     "auth_token", "access_token", "Ocp-Apim-Subscription-Key", "apikey", "x-auth-token"]
)  # fmt: skip


def _wrapped(form: str, name: str, secret: str, cookie: str, before: str, after: str) -> str:
    return f"{before} {form.format(name=name, secret=secret, cookie=cookie)} {after}".strip()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header_names, secrets, st.booleans())
def test_generated_secret_in_any_header_never_survives(name, secret, bearer):
    value = f"Bearer {secret}" if bearer else secret
    headers = redact_headers([(name, value), ("Accept", "*/*")])
    assert secret not in json.dumps(headers)
    assert headers["accept"] == "*/*"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(words, max_size=4), body_names, secrets)
def test_generated_secret_under_any_body_key_at_any_depth_never_survives(path, name, secret):
    assume(not {"logprobs", "probs"} & set(path))  # token texts, walked for key shapes only
    value: object = {name: secret}
    for key in reversed(path):
        value = {key: [value]}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": value}
    assert secret not in json.dumps(redact_json(body))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(TEXT_FORMS),
    text_names,
    secrets,
    words,
    st.sampled_from(["", "error:", "upstream said", "(", "log line 3 -"]),
    st.sampled_from(["", ".", ")", "and then it failed", ", retrying"]),
)
def test_generated_secret_in_free_text_never_survives(form, name, secret, cookie, before, after):
    text = _wrapped(form, name, secret, cookie, before, after)
    assert secret not in redact_text(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header_names, body_names, st.sampled_from(TEXT_FORMS), text_names, secrets, words)
def test_generated_secret_never_reaches_a_stored_exchange(header, key, form, name, secret, cookie):
    message = _wrapped(form, name, secret, cookie, "request failed:", "")
    record = {
        "request": {"model": "m", "messages": [{"role": "user", "content": message}], key: secret},
        "response": {"error": {"message": message, "code": 500}},
        "status": 500,
        "url": f"http://h/v1/chat/completions?{key}={secret}",
        "request_headers": {header: secret},
        "response_headers": {"x-echo": message},
    }
    exchange = exchange_from_record(record, file="gen.jsonl", source_format="jsonl")
    assert secret not in json.dumps(exchange.to_dict())


def test_curl_capture_with_every_new_form_holds_no_secret():
    secret = "Zx9secretValue77"
    command = (
        "curl http://h/v1/chat/completions "
        f"-H 'Ocp-Apim-Subscription-Key: {secret}' "
        f"-H 'X-Tenant-Auth: {secret}' "
        f'-d \'{{"auth": "{secret}", "credentials": {{"pass": "{secret}"}}, '
        f'"messages": [{{"role": "user", "content": "x-api-key {secret}"}}]}}\''
    )
    response = json.dumps({"error": {"message": f"Cookie session={secret}", "code": 401}})
    exchange = parse_curl(command, response, file="c.sh")
    assert secret not in json.dumps(exchange.to_dict())


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens 32768 exceeds the context size",
        "the key insight is that tokens 42 matter",
        "predicted_per_token_ms: 2.5, tokens_predicted: 128",
        "session 1 of 3",
        "The secret sauce is patience.",
    ],
)
def test_prose_and_counts_survive(text):
    assert redact_text(text) == text
    assert is_secret_name("max_tokens") is False
