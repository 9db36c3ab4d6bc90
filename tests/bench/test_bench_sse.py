"""Benchmark: SSE transcript parsing speed and memory (issue 27, item 9: 650,000 events,
29 MB took 109 s and 342 MB).

Not a timed test: prints events/s (CPU time of the parsing process, steadier than wall time
on a shared host) and the peak of memory allocated while parsing (tracemalloc, in a second
run: tracing slows the first down), and asserts only that the reply was re-assembled
whole. Run with `pytest -m bench -s tests/bench/test_bench_sse.py`.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from triage.capture import parse_sse_streams

pytestmark = pytest.mark.bench

EVENT = 'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
END = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize("events", [650_000])
def test_bench_sse_events_per_second(events: int) -> None:
    data = (EVENT * events + END).encode()
    parse_sse_streams(EVENT + END, file="warm-up")
    started = time.process_time()
    (exchange,) = parse_sse_streams(data, file="big.sse")
    cpu = time.process_time() - started
    assert exchange.response is not None
    assert exchange.response["choices"][0]["message"]["content"] == "x" * events
    tracemalloc.start()
    parse_sse_streams(data, file="big.sse")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"\nSSE: {events} events, {len(data) / 1e6:.1f} MB: {cpu:.1f} s CPU, "
        f"{events / cpu:,.0f} events/s; peak allocated while parsing {peak / 1e6:.0f} MB"
    )
