"""Prometheus metrics of the proxy (`/metrics`), one registry per proxy instance.

Request counts and latencies are updated on the hot path (cheap, lock-protected counters);
failures by signature, tokens and speculative-decoding draft acceptance are updated by the
recorder once an exchange is classified (by the recorder process's relay thread when the
recorder runs in a process of its own: its updates are replayed on this registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

# The proxy's own share of a request is sub-millisecond when all is well: finer buckets.
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def token_count(value: Any) -> int:
    """The token number to count: a positive int, else 0 (`true` from a broken upstream is
    not one token)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class ProxyMetrics:
    """The proxy's counters and histograms, in their own registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "triage_proxy_requests",
            "Requests forwarded, by path and status class.",
            ["path", "status_class"],
            registry=registry,
        )
        self.latency = Histogram(
            "triage_proxy_request_duration_seconds",
            "Time from request to the last response byte, by path and streaming.",
            ["path", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_byte = Histogram(
            "triage_proxy_time_to_first_byte_seconds",
            "Time from request to the upstream's response headers.",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "triage_proxy_overhead_seconds",
            "Time the proxy itself adds to a request: from its arrival to the upstream call,"
            " plus from the last upstream byte read to the last byte written to the client"
            " (not the time before the event loop reads it: see the event-loop lag).",
            ["path", "stream"],
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.loop_lag = Histogram(
            "triage_proxy_event_loop_lag_seconds",
            "How late the event loop wakes from a 50 ms sleep (sampled 20 times a second):"
            " requests arriving then wait that long before the proxy reads them.",
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.exchanges = Counter(
            "triage_proxy_exchanges",
            "Classified exchanges, by model.",
            ["model"],
            registry=registry,
        )
        self.failures = Counter(
            "triage_proxy_failures",
            "Failing exchanges, by model and failure signature.",
            ["model", "signature"],
            registry=registry,
        )
        self.tokens = Counter(
            "triage_proxy_tokens",
            "Tokens reported by the upstream (usage/timings), by model and kind.",
            ["model", "kind"],
            registry=registry,
        )
        self.draft_tokens = Counter(
            "triage_proxy_draft_tokens",
            "Speculative decoding: drafted and accepted tokens (timings.draft_*).",
            ["model", "kind"],
            registry=registry,
        )
        self.recording_dropped = Counter(
            "triage_proxy_recording_dropped",
            "Exchanges not recorded because the recording queue was full.",
            registry=registry,
        )
        self.spooled = Counter(
            "triage_proxy_spooled",
            "Exchanges written to the local spool because the database was unavailable.",
            registry=registry,
        )
        self.refused = Counter(
            "triage_proxy_refused",
            "Requests and connections the proxy refused or closed itself, by reason (path:"
            " not forwarded; header-timeout, body-timeout: the client was too slow;"
            " headers-too-large: 431; connections: over the connection bound).",
            ["reason"],
            registry=registry,
        )
        self.journal_replayed = Counter(
            "triage_proxy_journal_replayed",
            "Exchanges replayed at start from the journal of a proxy that was killed.",
            registry=registry,
        )
        self.journal_skipped = Counter(
            "triage_proxy_journal_skipped",
            "Exchanges not journaled (the journal folder was full or unwritable): a crash"
            " before they are recorded loses them.",
            registry=registry,
        )
        self.upstream_cut = Counter(
            "triage_proxy_upstream_cut",
            "Responses the upstream cut off mid-body (it closed or went quiet): the client's"
            " connection was aborted too (after an SSE error event for a stream).",
            ["path"],
            registry=registry,
        )
        self.incidents = Counter(
            "triage_proxy_incidents_opened",
            "Incidents opened by this proxy, by model and signature.",
            ["model", "signature"],
            registry=registry,
        )

    def observe_exchange(
        self, model: str, signature: str, usage: Mapping[str, int], count: int = 1
    ) -> None:
        """Counters of one classified exchange (called by the writer), or of `count` alike
        ones whose token numbers `usage` sums (the recorder process's summed batches)."""
        self.exchanges.labels(model).inc(count)
        if signature:
            self.failures.labels(model, signature).inc(count)
        for kind in ("prompt", "completion"):
            if value := token_count(usage.get(f"{kind}_tokens")):
                self.tokens.labels(model, kind).inc(value)
        for kind, key in (("drafted", "draft_n"), ("accepted", "draft_n_accepted")):
            if value := token_count(usage.get(key)):
                self.draft_tokens.labels(model, kind).inc(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
