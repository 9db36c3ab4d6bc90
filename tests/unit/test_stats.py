"""The sequential rule: honest k/n statistics, never a verdict from one sample."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triage.stats import baseline_reproduces, compare, look_schedule, wilson


def test_wilson_interval_matches_known_values() -> None:
    ci = wilson(7, 40)
    assert 0.08 < ci.low < 0.09 and 0.31 < ci.high < 0.33
    assert wilson(0, 0).as_list() == [0.0, 1.0]
    assert wilson(0, 10).low == 0.0


def test_look_schedule_doubles_up_to_the_cap() -> None:
    assert look_schedule(64) == [4, 8, 16, 32, 64]
    assert look_schedule(30) == [4, 8, 16, 30]
    assert look_schedule(3) == [3]


@pytest.mark.parametrize("k0,n0", [(1, 1), (4, 4)])
def test_no_removal_from_too_few_samples(k0: int, n0: int) -> None:
    # A single failing sample (or four deterministic ones at the first look) is not enough.
    assert compare(k0, n0, 0, n0).decision == "undecided"


def test_deterministic_failure_is_decided_at_the_second_look() -> None:
    result = compare(8, 8, 0, 8)
    assert result.decision == "removes"
    assert result.p_less < 0.001


def test_unchanged_needs_the_arm_to_keep_failing() -> None:
    assert compare(4, 4, 4, 4).decision == "undecided"  # too few replays to claim no effect
    assert compare(8, 8, 8, 8).decision == "unchanged"
    assert compare(6, 16, 3, 4).decision == "undecided"
    assert compare(10, 40, 8, 40).decision == "unchanged"
    # Rare failures in both arms: cannot tell yet.
    assert compare(3, 40, 3, 40).decision == "undecided"


def test_baseline_that_does_not_fail_blocks_any_verdict() -> None:
    assert compare(0, 8, 0, 8).decision == "no-baseline-failure"
    assert not baseline_reproduces(0, 30)
    assert baseline_reproduces(3, 30)


@given(st.integers(0, 64), st.integers(1, 64), st.integers(0, 64), st.integers(1, 64))
def test_removes_only_when_the_arm_fails_less(k0: int, n0: int, k1: int, n1: int) -> None:
    k0, k1 = min(k0, n0), min(k1, n1)
    result = compare(k0, n0, k1, n1)
    if result.decision == "removes":
        assert k1 / n1 < k0 / n0
        assert n1 >= 2 and n0 >= 2
    if result.decision == "unchanged":
        assert k1 > 0


def test_paired_replays_decide_unchanged_sooner_and_only_with_enough_failures() -> None:
    # 3/16 vs 3/16 unpaired is undecided; the same seeds failing in both arms says more.
    assert compare(4, 16, 4, 16).decision == "undecided"
    assert compare(4, 16, 4, 16, paired=(4, 0)).decision == "unchanged"
    # Too few baseline failures to claim anything from the pairs.
    assert compare(3, 16, 3, 16, paired=(3, 0)).decision == "undecided"
    # An arm that fixes most of the baseline's failing seeds is not "unchanged".
    assert compare(8, 16, 3, 16, paired=(8, 6)).decision == "undecided"
