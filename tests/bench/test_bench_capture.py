"""Benchmark: capture parsing time on large inputs (issue 18, defect 6).

Not timed tests: each prints a table row with the machine and only asserts that the input
was parsed correctly. Rows: a curl command with an 80 KB pretty-printed `-d '...'` body, one
with a 2 MB one-line body, and HAR files of 2,500 and 10,000 chat entries (time per entry
should stay constant within 2x: the parse is linear). Run with `make bench` or
`pytest -m bench -s tests/bench/test_bench_capture.py`.
"""

from __future__ import annotations

import json
import os
import platform
import time

import pytest

from triage.capture import parse, parse_curl

pytestmark = pytest.mark.bench

OK = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, " + (
        f"Python {platform.python_version()}"
    )


def pretty_body(size: int) -> str:
    messages: list[dict[str, str]] = []
    body = {"model": "m", "messages": messages}
    while len(json.dumps(body, indent=2)) < size:
        messages.extend(
            {"role": "user", "content": f"line {i} of a long pasted conversation"}
            for i in range(len(messages), len(messages) + 50)
        )
    return json.dumps(body, indent=2)


def one_line_body(size: int) -> str:
    message = {"role": "user", "content": "word " * (size // 5)}
    return json.dumps({"model": "m", "messages": [message]})


def curl_command(body: str) -> str:
    return (
        "curl http://127.0.0.1:8080/v1/chat/completions \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d '{body}'\n{json.dumps(OK)}\n"
    )


def best_of(runs: int, func) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return min(times)


@pytest.mark.parametrize(
    ("label", "body"),
    [
        ("curl -d body 80 KB pretty-printed", pretty_body(80 * 1024)),
        ("curl -d body 2 MB on one line", one_line_body(2 * 1024 * 1024)),
    ],
)
def test_bench_curl_body(label: str, body: str) -> None:
    command = curl_command(body)
    expected = json.loads(body)
    seconds = best_of(3, lambda: parse_curl(command, file="bench.curl"))
    assert parse_curl(command, file="bench.curl").request == expected
    print(f"\n{machine()}\n| {label} | {len(command):,} bytes | {seconds * 1000:.0f} ms |")


def har(entries: int) -> str:
    request_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    entry = {
        "startedDateTime": "2026-06-10T12:00:00.000Z",
        "time": 812.5,
        "request": {
            "method": "POST",
            "url": "http://127.0.0.1:8080/v1/chat/completions",
            "headers": [{"name": "Content-Type", "value": "application/json"}],
            "postData": {"mimeType": "application/json", "text": request_body},
        },
        "response": {
            "status": 200,
            "headers": [{"name": "Content-Type", "value": "application/json"}],
            "content": {"mimeType": "application/json", "text": json.dumps(OK)},
        },
        "timings": {"send": 0.1, "wait": 800.0, "receive": 12.4},
    }
    return json.dumps({"log": {"version": "1.2", "entries": [entry] * entries}})


def test_bench_har_parse_is_linear() -> None:
    rows = []
    for entries in (2_500, 10_000):
        text = har(entries)
        seconds = best_of(2, lambda text=text: parse(text, file="bench.har"))
        assert len(parse(text, file="bench.har")) == entries
        rows.append((entries, seconds))
    print(f"\n{machine()}")
    for entries, seconds in rows:
        per_entry_us = seconds / entries * 1e6
        print(f"| HAR {entries:,} entries | {seconds:.2f} s | {per_entry_us:.0f} us/entry |")
    per_entry = [seconds / entries for entries, seconds in rows]
    print(f"| per-entry ratio 10k / 2.5k | {per_entry[1] / per_entry[0]:.2f} (target <= 2) |")
