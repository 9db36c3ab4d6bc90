"""Property-based fuzzing: every parser gives an Exchange or a CaptureError, never anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.capture import (
    CaptureError,
    Exchange,
    detect_format,
    exchange_from_http,
    parse,
    parse_curl,
    parse_har,
    parse_jsonl,
    parse_pair,
    parse_pair_document,
    parse_sse,
    validate_exchange,
)
from triage.symptoms import KINDS, classify

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
SAMPLES = {
    "pair": (FIXTURES / "tool-args-schema-violation.json").read_bytes(),
    "curl": (FIXTURES / "thinking-budget-transcript.curl").read_bytes(),
    "sse": (FIXTURES / "stream-tool-deltas.sse").read_bytes(),
    "har": (FIXTURES / "agent-session.har").read_bytes(),
    "jsonl": (FIXTURES / "exchanges.jsonl").read_bytes(),
    "response": (FIXTURES / "real" / "toolcall-ok-seed1.response.json").read_bytes(),
    "request": (FIXTURES / "peg-gemma4-500.request.json").read_bytes(),
    "curl_i": (FIXTURES / "peg-gemma4-500.response.txt").read_bytes(),
}

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PARSERS: dict[str, Callable[[bytes], Any]] = {
    "pair": lambda data: parse_pair(SAMPLES["request"], data, file="f"),
    "pair_request": lambda data: parse_pair(data, SAMPLES["response"], file="f"),
    "pair_document": lambda data: parse_pair_document(data, file="f"),
    "curl": lambda data: parse_curl(data, file="f"),
    "curl_response": lambda data: parse_curl(
        b"curl http://h/v1/chat/completions -d '{}'", data, file="f"
    ),
    "sse": lambda data: parse_sse(data, file="f"),
    "har": lambda data: parse_har(data, file="f"),
    "jsonl": lambda data: parse_jsonl(data, file="f"),
    "auto": lambda data: parse(data, file="f"),
    "live": lambda data: exchange_from_http({"messages": []}, data, status=200),
}


def check_outcome(call: Callable[[], Any]) -> None:
    """The parser's contract: exchanges that validate and classify, or a CaptureError."""
    try:
        result = call()
    except CaptureError as exc:
        assert isinstance(exc.file, str) and exc.message
        assert isinstance(exc.location, (int, str, type(None)))
        # The last-resort guard turns a bug into a CaptureError; the fuzzer must not hit it.
        assert "cannot read capture (" not in exc.message, exc.message
        return
    exchanges = result if isinstance(result, list) else [result]
    assert exchanges
    for exchange in exchanges:
        assert isinstance(exchange, Exchange)
        data = exchange.to_dict()
        assert validate_exchange(data) == []
        json.dumps(data)  # storable
        findings = classify(exchange)
        assert {f.kind for f in findings} == set(KINDS)
        assert classify(data) == findings


def mutate(data: bytes, ops: list[tuple[int, int, int, bytes]]) -> bytes:
    """Apply (kind, position, length, payload) edits: flip, delete, insert, truncate, repeat."""
    out = bytearray(data)
    for kind, position, length, payload in ops:
        if not out:
            out.extend(payload)
            continue
        at = position % len(out)
        if kind == 0:
            out[at] = (out[at] + 1 + length) % 256
        elif kind == 1:
            del out[at : at + length]
        elif kind == 2:
            out[at:at] = payload
        elif kind == 3:
            del out[at:]
        else:
            out[at:at] = out[at : at + length]
    return bytes(out)


INTERESTING = st.sampled_from(
    [
        b"\n",
        b"\r\n",
        b"\n\n",
        b'"',
        b"'",
        b"\\",
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"null",
        b"data: ",
        b"data: [DONE]\n\n",
        b"error: ",
        b"event: error\n",
        b"\xff",
        b"\xc3",
        b"\x00",
        b"-d ",
        b"@",
        b" -H ",
        b"NaN",
        b"1e999",
        b"HTTP/1.1 500 x\r\n\r\n",
        b'"choices"',
        b'"tool_calls": 5',
        b'"arguments": {}',
        b"\xef\xbb\xbf",
    ]
)
EDITS = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.integers(0, 1 << 20),
        st.integers(0, 64),
        st.one_of(INTERESTING, st.binary(max_size=16)),
    ),
    min_size=1,
    max_size=6,
)


@FUZZ
@given(data=st.binary(max_size=2048), parser=st.sampled_from(sorted(PARSERS)))
def test_arbitrary_bytes(data, parser):
    check_outcome(lambda: PARSERS[parser](data))


@FUZZ
@given(text=st.text(max_size=1024), parser=st.sampled_from(sorted(PARSERS)))
def test_arbitrary_text(text, parser):
    check_outcome(lambda: PARSERS[parser](text.encode("utf-8")))


@FUZZ
@given(
    sample=st.sampled_from(sorted(SAMPLES)), edits=EDITS, parser=st.sampled_from(sorted(PARSERS))
)
def test_mutated_valid_captures(sample, edits, parser):
    data = mutate(SAMPLES[sample], edits)
    check_outcome(lambda: PARSERS[parser](data))


@FUZZ
@given(sample=st.sampled_from(sorted(SAMPLES)), edits=EDITS)
def test_detect_format_never_raises_unexpectedly(sample, edits):
    try:
        kind = detect_format(mutate(SAMPLES[sample], edits), "x")
    except CaptureError:
        return
    assert kind in {"pair", "curl", "sse", "har", "jsonl", "request", "response"}


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "message",
                    "content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "name",
                    "delta",
                    "error",
                    "index",
                    "finish_reason",
                    "usage",
                    "x",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, prefix + (i,))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


@FUZZ
@given(pick=st.integers(0, 10_000), new=JSON_VALUES, sample=st.sampled_from(["pair", "response"]))
def test_structurally_mutated_json(pick, new, sample):
    document = json.loads(SAMPLES[sample])
    paths = _paths(document)
    mutated = _replace(document, paths[pick % len(paths)], new)
    data = json.dumps(mutated).encode()
    if sample == "pair":
        check_outcome(lambda: parse_pair_document(data, file="f"))
        check_outcome(lambda: parse_jsonl(data + b"\n" + data, file="f"))
    else:
        check_outcome(lambda: parse_pair(SAMPLES["request"], data, file="f"))
        chunk = b"data: " + data + b"\n\ndata: [DONE]\n\n"
        check_outcome(lambda: parse_sse(chunk, file="f"))
