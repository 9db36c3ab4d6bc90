"""Benchmark: search, incident load, cause graph and family matching at team scale.

Not timed tests: on SQLite and PostgreSQL, a generated history (default 100,000 incidents,
1,000,000 evidence rows; TRIAGE_BENCH_INCIDENTS for a quicker run, 10 evidence rows per
incident) is built once per database, then each operation runs many times and the p50 /
p95 latencies are printed as one table with the machine. Targets at 100k incidents:
search p50 < 20 ms, incident load < 50 ms, family match < 100 ms.
Run with `make bench` (or `pytest -m bench tests/bench/test_bench_search.py -s`).
"""

from __future__ import annotations

import os
import platform
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datagen
import pytest

from kb.domain.family import signature
from kb.repo.bench_data import database_size, server_version
from kb.repo.family import similar_incidents
from kb.repo.search import search
from kb.repo.store import Store

# Generating the full-scale data takes minutes per database, far over the suite's timeout.
pytestmark = [pytest.mark.bench, pytest.mark.timeout(3600)]

INCIDENTS = int(os.environ.get("TRIAGE_BENCH_INCIDENTS", "100000"))
EVIDENCE_PER_INCIDENT = 10
SEARCHES = 300
LOADS = 100
FAMILY_MATCHES = 100
TARGETS_MS = {"search": 20.0, "load": 50.0, "family": 100.0}
FIXED_QUERIES = [
    "empty content finish length thinking",
    "tool call json broken",
    "speculative decoding draft",
    "qwen empty content",
    "gemma thinking budget",
    "HTTP 500 peg-gemma4 format",
    "timeout slots busy",
    "quantized weights A/B ties",
    "retry spiral",
    "reasoning_content max_tokens",
]
RESULTS: dict[str, dict[str, Any]] = {}


def _queries(rng: random.Random) -> list[str]:
    """What on-call types: a few words of a symptom, cause or change, sometimes a model."""
    sources = [
        *(t for texts in datagen.SYMPTOM_TEXT.values() for t in texts),
        *(title for title, _ in datagen.CAUSE_TEXT.values()),
        *datagen.EVIDENCE_TEXT,
        *datagen.CHANGES,
    ]
    families = [family for family, _ in datagen.MODELS]
    queries = list(FIXED_QUERIES)
    while len(queries) < SEARCHES:
        words = [w for w in re.findall(r"[a-z][a-z_-]{3,}", rng.choice(sources).lower())]
        if len(words) < 2:
            continue
        picked = rng.sample(words, min(len(words), rng.choice([2, 2, 3, 3, 4])))
        if rng.random() < 0.3:
            picked.append(rng.choice(families))
        queries.append(" ".join(picked))
    return queries


def _new_exchange_signature(rng: random.Random) -> Any:
    family, names = rng.choice(datagen.MODELS)
    stack = {
        "model": f"{rng.choice(names)}-{rng.choice(datagen.QUANTS)}.gguf",
        "server_build": f"b{rng.randint(4000, 11500)}",
        "args": ["-c", "8192"] + (["-md", "draft.gguf"] if rng.random() < 0.3 else []),
        "thinking_default": rng.random() < 0.6,
    }
    return signature(rng.sample(datagen.FINDING_KINDS, rng.randint(1, 4)), set(), stack)


def _timed(function: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = function()
    return (time.perf_counter() - started) * 1000, value


def _p(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    yield
    if RESULTS:
        print("\n" + table(RESULTS))


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def bench_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, dict[str, float]]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('bench') / 'bench.db'}"
    else:
        url = request.getfixturevalue("postgres_cluster").new_database()
    store = Store(url, migrate=False)
    print(f"\n[{request.param}] generating {INCIDENTS:,} incidents ...", flush=True)
    started = time.perf_counter()
    timings = datagen.generate(
        store,
        INCIDENTS,
        INCIDENTS * EVIDENCE_PER_INCIDENT,
        progress=lambda message: print(f"[{request.param}] {message}", flush=True),
    )
    timings["total_s"] = time.perf_counter() - started
    try:
        yield store, timings
    finally:
        store.close()


def test_bench_search_load_graph_family(bench_store: tuple[Store, dict[str, float]]) -> None:
    store, timings = bench_store
    rng = random.Random(1)
    result: dict[str, Any] = {
        "version": server_version(store),
        "generate_s": timings["total_s"],
        "index_s": timings["index_s"] + timings["signatures_s"],
        "size_mb": database_size(store) / 1e6,
    }

    search_ms: list[float] = []
    slugs: list[str] = []
    with store.session(readonly=True) as session:
        search(session, "warm up the caches")
        for query in _queries(rng):
            elapsed, hits = _timed(lambda q=query: search(session, q))
            search_ms.append(elapsed)
            slugs.extend(hit.slug for hit in hits[:3])
        reference_ms, hits = _timed(lambda: search(session, "empty content finish length thinking"))
        filtered_ms = [
            _timed(lambda q=q: search(session, q, status="fixed"))[0] for q in FIXED_QUERIES
        ]
    assert slugs, "the searches found nothing"
    result["search"] = search_ms
    result["search_filtered"] = filtered_ms
    result["reference_ms"] = reference_ms

    load_ms: list[float] = []
    graph_ms: list[float] = []
    evidence_rows: list[int] = []
    load_record, build_graph = _record_and_graph()
    with store.session(readonly=True) as session:
        for slug in rng.sample(slugs, min(LOADS, len(slugs))):
            elapsed, record = _timed(lambda s=slug: load_record(session, s))
            load_ms.append(elapsed)
            evidence_rows.append(len(record["evidence"]))
            elapsed, graph = _timed(lambda r=record: build_graph(r))
            graph_ms.append(elapsed)
            assert graph.number_of_nodes() > 0
    result["load"] = load_ms
    result["graph"] = graph_ms
    result["evidence_per_load"] = statistics.mean(evidence_rows)

    family_ms: list[float] = []
    with store.session(readonly=True) as session:
        similar_incidents(session, _new_exchange_signature(rng))
        for _ in range(FAMILY_MATCHES):
            query = _new_exchange_signature(rng)
            elapsed, matches = _timed(lambda q=query: similar_incidents(session, q, 10))
            family_ms.append(elapsed)
            assert matches
    result["family"] = family_ms
    RESULTS[store.dialect] = result


def _record_and_graph() -> tuple[Callable[..., dict[str, Any]], Callable[..., Any]]:
    """kb.repo.files.load_record and triage.graph.build_graph (networkx directly if absent)."""
    from kb.repo.files import load_record

    try:
        from triage.graph import build_graph
    except ImportError:  # pragma: no cover - the graph module is part of the product
        import networkx as nx

        def build_graph(record: dict[str, Any]) -> Any:
            graph = nx.MultiDiGraph()
            for cause in record.get("causes", []):
                graph.add_node(f"cause:{cause['id']}")
                for link in cause.get("evidence", []):
                    graph.add_edge(f"evidence:{link['id']}", f"cause:{cause['id']}")
            for evidence in record.get("evidence", []):
                graph.add_node(f"evidence:{evidence['id']}")
            return graph

    return load_record, build_graph


def table(results: dict[str, dict[str, Any]]) -> str:
    """The benchmark table: one column per database, with the machine it ran on."""
    dialects = [d for d in ("sqlite", "postgresql") if d in results]
    cpu = platform.processor() or platform.machine()
    model = _cpu_model()
    lines = [
        f"triage kb benchmark: {INCIDENTS:,} incidents, "
        f"{INCIDENTS * EVIDENCE_PER_INCIDENT:,} evidence rows",
        f"machine: {platform.platform()}; {model or cpu}; {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}",
    ]

    def row(label: str, cells: list[str], target: str = "") -> str:
        return f"{label:<34}" + "".join(f"{c:>22}" for c in cells) + f"  {target}"

    lines.append(row("", [results[d]["version"] for d in dialects], "target"))
    lines.append(row("generate + index (s)", [f"{results[d]['generate_s']:.0f}" for d in dialects]))
    lines.append(
        row("  of which index + signatures (s)", [f"{results[d]['index_s']:.0f}" for d in dialects])
    )
    lines.append(row("database size (MB)", [f"{results[d]['size_mb']:.0f}" for d in dialects]))
    for key, label, target in (
        ("search", f"search p50 / p95 (ms, n={SEARCHES})", "p50 < 20 ms"),
        ("search_filtered", "search --status p50 / p95 (ms)", ""),
        ("load", "incident load p50 / p95 (ms)", "< 50 ms"),
        ("graph", "cause graph p50 / p95 (ms)", ""),
        ("family", "family match p50 / p95 (ms)", "< 100 ms"),
    ):
        lines.append(
            row(
                label,
                [
                    f"{_p(results[d][key], 50):.1f} / {_p(results[d][key], 95):.1f}"
                    for d in dialects
                ],
                target,
            )
        )
    lines.append(
        row("reference query (ms)", [f"{results[d]['reference_ms']:.1f}" for d in dialects])
    )
    lines.append(
        row(
            "evidence rows per loaded incident",
            [f"{results[d]['evidence_per_load']:.1f}" for d in dialects],
        )
    )
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
