"""The sequential rule: honest k/n statistics, never a verdict from one sample."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.stats import (
    EFFECT_RATIO,
    baseline_reproduces,
    compare,
    look_schedule,
    removes_evalue,
    unchanged_evalue,
    wilson,
)


def test_wilson_interval_matches_known_values() -> None:
    ci = wilson(7, 40)
    assert 0.08 < ci.low < 0.09 and 0.31 < ci.high < 0.33
    assert wilson(0, 0).as_list() == [0.0, 1.0]
    assert wilson(0, 10).low == 0.0


def test_look_schedule_steps_by_the_first_look_up_to_the_cap() -> None:
    # Deliberate change (issue 15): the e-value rule is valid at any looks, so the engine
    # looks after every round of 4 replies instead of doubling.
    assert look_schedule(64) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64]
    assert look_schedule(30) == [4, 8, 12, 16, 20, 24, 28, 30]
    assert look_schedule(16, first=8) == [8, 16]
    assert look_schedule(3) == [3]
    # The previous schedule, for callers still on the Bonferroni rule.
    assert look_schedule(64, doubling=True) == [4, 8, 16, 32, 64]
    assert look_schedule(30, doubling=True) == [4, 8, 16, 30]


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


# No deadline: a loaded CI machine makes scipy's first calls slow; speed is not under test.
@settings(deadline=None)
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
    # 4/16 vs 4/16 unpaired is undecided; the same seeds failing in both arms says more.
    assert compare(4, 16, 4, 16).decision == "undecided"
    assert compare(4, 16, 4, 16, paired=(4, 0)).decision == "unchanged"
    # Three seeds failing on both sides and none on one side only are enough (issue 15: the
    # bolder bet of the mixture pays 3.6x per such seed); two are too few.
    assert compare(3, 16, 3, 16, paired=(3, 0)).decision == "unchanged"
    assert compare(2, 16, 2, 16, paired=(2, 0)).decision == "undecided"
    # One baseline-only failure among them costs the bold bet nearly all it won.
    assert compare(4, 16, 3, 16, paired=(4, 1)).decision == "undecided"
    # An arm that fixes most of the baseline's failing seeds is not "unchanged".
    assert compare(8, 16, 3, 16, paired=(8, 6)).decision == "undecided"


# -- the e-value rule (issue 15): what compare decides when the engine passes seed pairs ----


def test_the_default_rule_is_the_e_value_rule_only_with_pairs_and_several_looks() -> None:
    assert compare(8, 8, 0, 8, paired=(8, 8)).rule == "e-value"
    assert compare(8, 8, 0, 8).rule == "bonferroni"  # no pairs: the earlier rule
    assert compare(8, 16, 0, 8, paired=(4, 4)).rule == "bonferroni"  # not every reply paired
    # One planned look is a plain Fisher test at alpha (the bench's fixed-30 design).
    one = compare(5, 30, 0, 30, paired=(5, 5), looks=1)
    assert one.rule == "bonferroni" and one.alpha_per_look == 0.05
    with pytest.raises(ValueError, match="unknown rule"):
        compare(1, 4, 0, 4, rule="pocock")


def test_deterministic_failure_removed_after_five_pairs_never_at_four() -> None:
    # 4 of 4 baseline failures, none in the arm: the bets reach 13 < 20.
    four = compare(4, 4, 0, 4, paired=(4, 4))
    assert four.decision == "undecided" and four.e_removes is not None
    assert four.e_removes < 20
    eight = compare(8, 8, 0, 8, paired=(8, 8))
    assert eight.decision == "removes" and eight.e_removes >= 20
    # The arm that fixes every failing seed is never "unchanged".
    assert compare(64, 64, 0, 64, paired=(64, 64)).decision == "removes"


def test_a_kept_deterministic_failure_is_unchanged_at_the_first_look() -> None:
    # Deliberate change: 4 of 4 pairs failing on both sides is "unchanged" at 4 (an arm that
    # removed three quarters of the failures would show that with probability <= 0.25^4).
    assert compare(4, 4, 4, 4, paired=(4, 0)).decision == "unchanged"
    assert compare(3, 3, 3, 3, paired=(3, 0)).decision == "undecided"  # fewer than 4 pairs


def test_intermittent_failure_needs_five_baseline_only_failures_to_remove() -> None:
    # 4/16 vs 0/16 is suggestive (Fisher p = 0.05) but not enough for an anytime claim.
    assert compare(4, 16, 0, 16, paired=(4, 4)).decision == "undecided"
    assert compare(5, 24, 0, 24, paired=(5, 5)).decision == "removes"
    # An arm failure on another seed costs a bet: 5 vs 1 arm-only is not yet enough.
    assert compare(5, 24, 1, 24, paired=(5, 5)).decision == "undecided"
    assert compare(9, 40, 1, 40, paired=(9, 9)).decision == "undecided"
    assert compare(10, 44, 1, 44, paired=(10, 10)).decision == "removes"


def test_no_reproduction_needs_sixteen_clean_baseline_replays() -> None:
    # A failure that shows up one time in five is 0/4 in 41% of the triages: not a reason to
    # give up (the earlier rule did, at 0/4).
    assert compare(0, 4, 0, 4, paired=(0, 0)).decision == "undecided"
    assert compare(0, 12, 1, 12, paired=(0, 0)).decision == "undecided"
    assert compare(0, 16, 0, 16, paired=(0, 0)).decision == "no-baseline-failure"


@settings(deadline=None)
@given(st.integers(1, 64), st.data())
def test_e_value_rule_never_removes_from_fewer_than_five_fixed_failures(n: int, data) -> None:
    k0 = data.draw(st.integers(0, n))
    fixed = data.draw(st.integers(0, k0))
    k1 = data.draw(st.integers(k0 - fixed, n - fixed))  # arm fails on the unfixed ones + others
    result = compare(k0, n, k1, n, paired=(k0, fixed))
    if result.decision == "removes":
        assert fixed >= 5 and k1 < k0
    if result.decision == "unchanged":
        assert k1 > 0 and n >= 4


def _exact_crossing(
    p: float, arm_rate: float, n: int, evalue, alpha: float = 0.05, coupled: bool = False
) -> float:
    """P(the bet on (arm-only, baseline-only, both) counts ever reaches 1/alpha within n
    independent pairs), by dynamic programming over the counts. `coupled`: inside a pair
    the arm fails only on a seed the baseline fails on (same marginal rates)."""
    size = n + 1
    mass = np.zeros((size, size, size))
    mass[0, 0, 0] = 1.0
    crossed = 0.0
    a, b, c = np.meshgrid(np.arange(size), np.arange(size), np.arange(size), indexing="ij")
    hit = evalue(a, b, c) >= 1 / alpha
    probs = {
        (1, 0, 0): (1 - p) * arm_rate,
        (0, 1, 0): p * (1 - arm_rate),
        (0, 0, 1): p * arm_rate,
        (0, 0, 0): (1 - p) * (1 - arm_rate),
    }
    if coupled:  # both fail with the arm's rate, the baseline alone with the difference
        probs = {(0, 1, 0): p - arm_rate, (0, 0, 1): arm_rate, (0, 0, 0): 1 - p}
    for _ in range(n):
        new = np.zeros_like(mass)
        for (da, db, dc), q in probs.items():
            new[da:, db:, dc:] += q * mass[: size - da, : size - db, : size - dc]
        crossed += new[hit].sum()
        new[hit] = 0.0
        mass = new
    return crossed


@pytest.mark.parametrize("p", [1.0, 0.6, 0.35, 0.2, 0.1, 0.05])
def test_removes_bet_crosses_with_probability_at_most_alpha_under_no_effect(p: float) -> None:
    # Exact, not simulated: the chance the removal bet EVER reaches 20 within the cap when the
    # arm has no effect, an upper bound on the rule's false confirmations at any looks.
    crossing = _exact_crossing(p, p, 64, lambda a, b, c: removes_evalue(a, b))
    assert crossing <= 0.05
    if 0.2 <= p < 1:
        assert crossing > 0.005  # the bound is used, not wasted


@pytest.mark.parametrize("coupled", [False, True])
@pytest.mark.parametrize("p", [1.0, 0.6, 0.2, 0.05])
def test_unchanged_bet_crosses_with_probability_at_most_alpha_at_a_fourfold_cut(
    p: float, coupled: bool
) -> None:
    # The hardest case for "unchanged": the arm cuts the rate exactly fourfold -- with
    # independent replies and with the arm failing only on seeds the baseline fails on (the
    # concordant failures the bolder bet pays most for).
    crossing = _exact_crossing(
        p,
        EFFECT_RATIO * p,
        64,
        lambda a, b, c: unchanged_evalue(a, b, c),
        coupled=coupled,
    )
    assert crossing <= 0.05


def test_e_value_rule_without_pairs_assumes_the_least_informative_pairing() -> None:
    # Counts only: failures are assumed to fall on different seeds (no concordant failure).
    assert compare(8, 8, 0, 8, rule="e-value").decision == "removes"
    assert compare(10, 40, 8, 40, rule="e-value").decision == "undecided"
    # The same counts with 8 failures on shared seeds are evidence of no effect.
    assert compare(10, 40, 8, 40, paired=(10, 2)).decision == "unchanged"
    with pytest.raises(ValueError, match="as many baseline replies"):
        compare(8, 16, 0, 8, rule="e-value")


def test_no_verdict_from_fewer_failing_pairs_than_min_deciding_failures() -> None:
    from triage.stats import evalue_decisions, min_deciding_failures

    fewest = min_deciding_failures()
    assert fewest == 3
    # Every split of fewer failing pairs into arm-only / baseline-only / both, at every look.
    for n in range(4, 65, 4):
        for arm_only in range(fewest):
            for base_only in range(fewest - arm_only):
                for both in range(fewest - arm_only - base_only):
                    decision = evalue_decisions(
                        [base_only + both], [n], [arm_only], [base_only], [both]
                    )[0]
                    assert decision not in ("removes", "unchanged"), (n, arm_only, base_only)
    assert compare(fewest, 4, fewest, 4, paired=(fewest, 0)).decision == "unchanged"
