"""Benchmark (not a timed test): what recording costs the proxy process, with the recorder
as a thread of the proxy (`--recorder thread`) and in a process of its own (the default).

For 1 KB and 64 KB exchanges (`raw_record`, every tenth one failing): the time `submit()`
takes on the caller's thread (the event loop in the proxy), p50 / p99; the CPU the proxy
process itself spends per exchange (submit + the queue's feeder thread + applying the
child's metric updates, or the whole classification in thread mode); and the CPU the
recorder process spends per exchange (redact, classify, compress, write to SQLite; start-up
excluded). Run with `make bench` or
`pytest -m bench -s -p no:cacheprovider tests/bench/test_bench_recorder_process.py`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triage.proxy import Recorder, RecorderProcess

pytestmark = [pytest.mark.bench, pytest.mark.timeout(0)]

N_RECORDS = 1000


def _record(key: str, content: str, at: float) -> dict[str, Any]:
    """An exchange as the forwarder hands it over (as tests/unit/proxy_fakes.raw_record)."""
    reply = {
        "object": "chat.completion",
        "model": "bench.gguf",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return {
        "key": key,
        "at": at,
        "method": "POST",
        "path": "/v1/chat/completions",
        "recordable": True,
        "request_body": json.dumps(request).encode(),
        "request_headers": [(b"content-type", b"application/json"), (b"user-agent", b"bench/1")],
        "client": "bench/1",
        "status": 200,
        "response_headers": [(b"content-type", b"application/json")],
        "response_chunks": [json.dumps(reply).encode()],
        "elapsed_ms": 12.0,
        "ttfb_ms": 11.0,
        "timed_out": False,
        "transport_error": None,
        "client_disconnected": False,
        "body_truncated": False,
        "upstream_truncated": False,
        "stream": False,
        "identity": {"model": "bench.gguf", "build": "b11434", "template_sha256": "a" * 64},
    }


def _records(prefix: str, size: int) -> list[dict[str, Any]]:
    now = time.time()
    padding = "x" * max(0, size - 600)
    return [
        _record(
            f"{prefix}-{i:05d}",
            "" if i % 10 == 0 else f"A complete answer. {padding}",
            at=now + i * 0.001,
        )
        for i in range(N_RECORDS)
    ]


def _run(recorder: Recorder | RecorderProcess, records: list[dict[str, Any]]) -> dict[str, float]:
    recorder.start()
    try:
        own_before = time.process_time()
        submits = []
        for record in records:
            started = time.perf_counter()
            assert recorder.submit(record)
            submits.append(time.perf_counter() - started)
        recorder.flush(len(records), timeout=600)
        own = time.process_time() - own_before
    finally:
        recorder.stop()
    child = 0.0
    if isinstance(recorder, RecorderProcess):
        child = recorder.child_cpu_seconds - recorder.startup_cpu_seconds
    values = np.array(submits) * 1e6
    return {
        "submit_p50_us": float(np.percentile(values, 50)),
        "submit_p99_us": float(np.percentile(values, 99)),
        "own_ms": own * 1000 / len(records),
        "child_ms": child * 1000 / len(records),
    }


def test_recording_cost_in_the_proxy_process(tmp_path: Path) -> None:
    rows = []
    for size in (1024, 65536):
        for mode in ("thread", "process"):
            records = _records(f"{mode}-{size}", size)
            url = f"sqlite:///{tmp_path / f'{mode}-{size}.db'}"
            spool = tmp_path / f"{mode}-{size}.jsonl"
            recorder: Recorder | RecorderProcess
            if mode == "thread":
                recorder = Recorder(url, spool_path=spool)
            else:
                recorder = RecorderProcess(url, spool_path=spool)
            result = _run(recorder, records)
            assert recorder.written == N_RECORDS
            rows.append((size, mode, result))
    print(f"\nrecording cost, {N_RECORDS} exchanges each, load average {os.getloadavg()}")
    print(
        "| exchange | recorder | submit p50 / p99 us | proxy process CPU ms/exchange "
        "| recorder process CPU ms/exchange |"
    )
    print("|---|---|---|---|---|")
    for size, mode, r in rows:
        child = f"{r['child_ms']:.3f}" if mode == "process" else "-"
        print(
            f"| {size // 1024} KB | {mode} | {r['submit_p50_us']:.1f} / {r['submit_p99_us']:.1f} "
            f"| {r['own_ms']:.3f} | {child} |"
        )
