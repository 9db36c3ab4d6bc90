"""Honest statistics for intermittent failures: Wilson intervals, Fisher's exact test and
sequential rules that stop an arm as soon as the data decide it.

An arm (the failing request with one candidate cause removed) is compared with the baseline
replay of the same request. The engine replays arm and baseline with the same seeds, so replay
i of the arm and replay i of the baseline form a pair. Two rules:

"e-value" (the default when the seed-matched pairs are known): two anytime-valid tests built
from the pairs, each a product of bets that is a nonnegative supermartingale under its null
hypothesis, whatever the correlation inside a pair. By Ville's inequality the chance that
one ever reaches 1/alpha under its null is at most alpha, however often and whenever it is
looked at, so the looks need no Bonferroni correction and can be as frequent as the slots.

* "removes": null "the arm fails at least as often as the baseline". A pair where only the
  baseline fails is then no more likely than one where only the arm fails; a bet on the
  baseline-only side pays (1 + lam) and loses to (1 - lam) (a mixture over lam, weighted
  towards lam = 1: a cause that removes the failure makes every discordant pair go that way).
  Decided when the mixture reaches 1/alpha and at least MIN_REMOVES_FAILURES baseline failures
  were fixed by the arm: 5 discordant pairs at the fastest, never one sample.
* "unchanged": null "the arm removes at least 1 - effect_ratio of the failures" (arm rate
  <= effect_ratio x baseline rate). Per pair Y = arm_failed - effect_ratio * baseline_failed
  has mean <= 0 under that null; the bets pay (1 + lam * Y), 0 < lam < 1 / effect_ratio. A
  deterministic failure that the arm keeps is "unchanged" at the first look (4 of 4 pairs
  failing on both sides: an arm that removed three quarters of the failures would do that
  with probability <= 0.25^4); three seeds failing on both sides and none on one side only
  are enough (at n >= 4).

Guaranteed, per arm and so per cause: P(removes | the arm does not lower the failure rate)
<= alpha and P(unchanged | the arm cuts the rate at least fourfold) <= alpha, at every baseline
rate, with any look schedule, assuming only that pairs are independent of each other.

"bonferroni" (the earlier rule, still used without seed-matched pairs, e.g. against a
baseline recorded earlier with a different number of replies): one-sided Fisher exact p below
alpha / looks removes; "unchanged" needs at least MIN_UNCHANGED_N replays and the lower 95%
Wilson bound of the arm's rate above effect_ratio x the baseline's upper bound (or, with pairs,
an upper bound below 1 - effect_ratio on the share of the baseline's failures the arm fixed).

Otherwise "undecided", and the arm gets more replays at the next look, up to the cap.
`triage.simulate` measures both rules' error rates and request counts (`make sim`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binomtest, fisher_exact

ALPHA = 0.05
FIRST_LOOK = 4
DEFAULT_CAP = 64
# "Removing the cause removes the symptom" means at least a fourfold drop in the failure rate;
# an arm that provably keeps more than a quarter of the baseline's rate is "unchanged".
EFFECT_RATIO = 0.25
# Bonferroni rule: "unchanged" is a claim about the absence of an effect: never made on fewer
# replays than this, even when a handful of failures already bound the rate (e.g. 3/4 failing).
MIN_UNCHANGED_N = 8
# The paired form of "unchanged" needs at least this many baseline failures to look at.
MIN_PAIRED_FAILURES = 4
# E-value rule: never "removes" from fewer baseline failures fixed by the arm than this (the
# bets need five at the fastest anyway), nor "unchanged" from fewer pairs than this.
MIN_REMOVES_FAILURES = 3
MIN_PAIRS = FIRST_LOOK
# E-value rule: "no-baseline-failure" (give up: the failure does not reproduce) only once the
# baseline's upper 95% Wilson bound is below this rate (0 failures in 16 replays). Earlier, a
# failure that shows up one time in five would be abandoned after 0/4 in 41% of the triages.
NO_REPRO_BOUND = 0.2
RULES = ("e-value", "bonferroni")
# (lam, weight) of the mixture of bets; chosen with `make sim` (see triage/simulate.py).
# Removes: most weight on lam = 1 (a removed cause sends every discordant pair the baseline's
# way; 0.6 * 2^5 + 0.25 * 1.8^5 >= 20 decides after five), the rest on smaller bets that
# survive an unrelated arm failure (10 baseline-only vs 1 arm-only still decides).
REMOVES_BETS = ((1.0, 0.6), (0.8, 0.25), (0.5, 0.15))
# Unchanged: 0.7 on lam = 2 (pays 3x on an arm-only failure, 2.5x on both failing, halves on a
# baseline-only failure) and 0.3 on lam = 3.5 (4.5x, 3.6x, 0.125x). A seed that fails on both
# sides is what an arm without effect shows on a real server (same seed, same sampling), and
# the bolder bet decides after three such failures instead of four: 22% fewer requests for
# "unchanged" at failure rates 0.15-0.6 with coupled seeds, 2-6% more with independent
# replies (`make sim` and `--coupling 1`). lam = 2 alone was the best single bet.
UNCHANGED_BETS = ((2.0, 0.7), (3.5, 0.3))


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4)]


@functools.lru_cache(maxsize=4096)
def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for k failures in n trials (n = 0: the whole [0, 1]). Cached:
    the engine asks for the same few (k, n) at every look, and scipy's is slow (~0.1 ms)."""
    if n <= 0:
        return Interval(0.0, 1.0)
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(float(ci.low), float(ci.high))


@functools.lru_cache(maxsize=4096)
def fisher_less(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided Fisher exact p that the arm (k1/n1) fails less often than baseline (k0/n0)."""
    if n0 <= 0 or n1 <= 0:
        return 1.0
    table = [[k1, n1 - k1], [k0, n0 - k0]]
    return float(fisher_exact(table, alternative="less").pvalue)


@functools.lru_cache(maxsize=4096)
def fisher_two_sided(k1: int, n1: int, k0: int, n0: int) -> float:
    """Two-sided Fisher exact p of arm vs baseline (reported next to every arm)."""
    if n0 <= 0 or n1 <= 0:
        return 1.0
    return float(fisher_exact([[k1, n1 - k1], [k0, n0 - k0]]).pvalue)


def look_schedule(
    cap: int = DEFAULT_CAP, first: int = FIRST_LOOK, *, doubling: bool = False
) -> list[int]:
    """Cumulative sample sizes at which an arm is examined: first, 2*first, 3*first, ...
    capped. Every `first` replies (one round of the server's slots): the e-value rule is valid
    at any looks, and looking often stops sooner (doubling cost a quarter to a third more
    requests at failure rates 0.2-0.35, `make sim`). `doubling=True` gives the previous
    first, 2*first, 4*first, ... schedule: fewer looks for the Bonferroni rule, which divides
    alpha by their number."""
    cap = max(cap, 1)
    first = max(first, 1)
    if doubling:
        sizes = []
        n = min(first, cap)
        while n < cap:
            sizes.append(n)
            n *= 2
    else:
        sizes = list(range(min(first, cap), cap, first))
    sizes.append(cap)
    return sizes


@dataclass(frozen=True)
class Comparison:
    """Arm vs baseline at one look."""

    k0: int
    n0: int
    k1: int
    n1: int
    p_less: float
    p_two_sided: float
    alpha_per_look: float
    decision: str  # removes | unchanged | undecided | no-baseline-failure
    rule: str = "bonferroni"
    e_removes: float | None = None  # e-value rule: the two running bets
    e_unchanged: float | None = None

    @property
    def rate(self) -> float:
        return self.k1 / self.n1 if self.n1 else 0.0

    @property
    def interval(self) -> Interval:
        return wilson(self.k1, self.n1)


def compare(
    k0: int,
    n0: int,
    k1: int,
    n1: int,
    *,
    looks: int = len(look_schedule()),
    alpha: float = ALPHA,
    effect_ratio: float = EFFECT_RATIO,
    paired: tuple[int, int] | None = None,
    rule: str | None = None,
) -> Comparison:
    """Decide an arm against the baseline at one look (see the module docstring).

    `paired` = (baseline failures among seed-matched pairs, how many of those the arm fixed).
    `rule` defaults to "e-value" when the pairs are given, both sides have the same number of
    replies (every reply paired) and there is more than one look; else "bonferroni" (with one
    look: a plain one-sided Fisher test at alpha). `looks` only matters for "bonferroni".
    """
    rule = rule or ("e-value" if paired is not None and n0 == n1 and looks > 1 else "bonferroni")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {', '.join(RULES)}")
    p_less = fisher_less(k1, n1, k0, n0)
    p_two = fisher_two_sided(k1, n1, k0, n0)
    if rule == "bonferroni":
        decision = _bonferroni_decision(
            k0,
            n0,
            k1,
            n1,
            p_less,
            looks=looks,
            alpha=alpha,
            effect_ratio=effect_ratio,
            paired=paired,
        )
        return Comparison(k0, n0, k1, n1, p_less, p_two, alpha / max(looks, 1), decision)
    arm_only, base_only, both = pair_counts(k0, n0, k1, n1, paired)
    e_rm = float(removes_evalue(arm_only, base_only))
    e_un = float(unchanged_evalue(arm_only, base_only, both, effect_ratio))
    decision = str(
        evalue_decisions(
            np.array([k0]),
            np.array([n0]),
            np.array([arm_only]),
            np.array([base_only]),
            np.array([both]),
            alpha=alpha,
            effect_ratio=effect_ratio,
        )[0]
    )
    return Comparison(k0, n0, k1, n1, p_less, p_two, alpha, decision, "e-value", e_rm, e_un)


def _bonferroni_decision(
    k0: int,
    n0: int,
    k1: int,
    n1: int,
    p_less: float,
    *,
    looks: int,
    alpha: float,
    effect_ratio: float,
    paired: tuple[int, int] | None,
) -> str:
    if n0 > 0 and n1 > 0 and p_less < alpha / max(looks, 1):
        return "removes"
    if (
        n1 >= MIN_UNCHANGED_N
        and n0 > 0
        and (
            wilson(k1, n1).low > effect_ratio * wilson(k0, n0).high
            or _paired_unchanged(paired, effect_ratio)
        )
    ):
        return "unchanged"
    if _no_baseline_failure(k0, n0):
        return "no-baseline-failure"
    return "undecided"


def _no_baseline_failure(k0: int, n0: int) -> bool:
    """The baseline itself does not reproduce: nothing can be removed."""
    return n0 > 0 and k0 == 0 and wilson(k0, n0).high < 0.5


def pair_counts(
    k0: int, n0: int, k1: int, n1: int, paired: tuple[int, int] | None
) -> tuple[int, int, int]:
    """(pairs where only the arm failed, only the baseline failed, both failed).

    With `paired` = (baseline failures among the pairs, how many the arm fixed) the counts are
    exact. Without, the arrangement of failures that gives the least evidence either way is
    taken: as many discordant pairs as the counts allow (a concordant failure is evidence for
    "unchanged", a discordant pair against both bets' nulls less than a concordant one)."""
    if n0 != n1:
        raise ValueError(f"pairs need as many baseline replies as arm replies ({n0} vs {n1})")
    if paired is not None:
        base_failures, fixed = paired
        both = max(base_failures - fixed, 0)
        return max(k1 - both, 0), max(fixed, 0), both
    both = max(k0 + k1 - n0, 0)
    return k1 - both, k0 - both, both


def removes_evalue(
    arm_only: Any, base_only: Any, bets: tuple[tuple[float, float], ...] | None = None
) -> Any:
    """Mixture of bets against "the arm fails at least as often as the baseline" (arrays ok).

    Under that null a discordant pair is baseline-only with probability <= 1/2, so each bet
    (1 + lam)^base_only * (1 - lam)^arm_only is a test supermartingale."""
    arm_only, base_only = np.asarray(arm_only, float), np.asarray(base_only, float)
    total = np.zeros(np.broadcast(arm_only, base_only).shape)
    for lam, weight in bets or REMOVES_BETS:
        total = total + weight * (1.0 + lam) ** base_only * (1.0 - lam) ** arm_only
    return total


def unchanged_evalue(
    arm_only: Any,
    base_only: Any,
    both: Any,
    effect_ratio: float = EFFECT_RATIO,
    bets: tuple[tuple[float, float], ...] | None = None,
) -> Any:
    """Mixture of bets against "the arm fails at most effect_ratio times as often as the
    baseline" (arrays ok): per pair Y = arm_failed - effect_ratio * baseline_failed has mean
    <= 0 under that null and lies in [-effect_ratio, 1]; each bet multiplies by 1 + lam * Y
    with 0 < lam < 1 / effect_ratio."""
    arm_only, base_only = np.asarray(arm_only, float), np.asarray(base_only, float)
    both = np.asarray(both, float)
    total = np.zeros(np.broadcast(arm_only, base_only, both).shape)
    for lam, weight in bets or UNCHANGED_BETS:
        lam = min(lam, 0.999 / effect_ratio)
        total = total + weight * (
            (1.0 + lam) ** arm_only
            * (1.0 + lam * (1.0 - effect_ratio)) ** both
            * (1.0 - lam * effect_ratio) ** base_only
        )
    return total


def evalue_decisions(
    k0: Any,
    n: Any,
    arm_only: Any,
    base_only: Any,
    both: Any,
    *,
    alpha: float = ALPHA,
    effect_ratio: float = EFFECT_RATIO,
) -> Any:
    """The e-value rule on arrays of paired counts (what `compare` and the simulator call)."""
    k0, n = np.asarray(k0), np.asarray(n)
    e_rm = removes_evalue(arm_only, base_only)
    e_un = unchanged_evalue(arm_only, base_only, both, effect_ratio)
    removes = (e_rm >= 1.0 / alpha) & (np.asarray(base_only) >= MIN_REMOVES_FAILURES)
    unchanged = (e_un >= 1.0 / alpha) & (n >= MIN_PAIRS)
    no_failure = (k0 == 0) & (n >= _no_repro_n())
    out = np.full(np.shape(removes), "undecided", dtype=object)
    out[no_failure] = "no-baseline-failure"
    out[unchanged] = "unchanged"
    out[removes] = "removes"
    return out


@functools.lru_cache(maxsize=1)
def min_deciding_failures(alpha: float = ALPHA, effect_ratio: float = EFFECT_RATIO) -> int:
    """The fewest failing seed pairs on which the e-value rule reaches any verdict: 3 with the
    default bets ("unchanged" from three seeds failing on both sides or in the arm only;
    "removes" needs five baseline failures the arm fixed). With fewer, no arm can be decided,
    so the scheduler does not call an arm moot before the baseline has failed that often."""
    k = 1
    while not (
        unchanged_evalue(0, 0, k, effect_ratio) >= 1.0 / alpha
        or unchanged_evalue(k, 0, 0, effect_ratio) >= 1.0 / alpha
        or (k >= MIN_REMOVES_FAILURES and removes_evalue(0, k) >= 1.0 / alpha)
    ):
        k += 1
    return k


@functools.lru_cache(maxsize=1)
def _no_repro_n() -> int:
    """Replays without a baseline failure after which it counts as not reproducing."""
    n = 1
    while wilson(0, n).high >= NO_REPRO_BOUND:
        n += 1
    return n


def _paired_unchanged(paired: tuple[int, int] | None, effect_ratio: float) -> bool:
    """Seed-matched pairs: if removing the cause took away at least 1 - effect_ratio of the
    failures, the arm would fix at least that share of the replays the baseline failed (in
    expectation, whether or not the arm's randomness follows the seed). An upper 95% Wilson
    bound below that share excludes the effect."""
    if paired is None:
        return False
    base_failures, fixed = paired
    if base_failures < MIN_PAIRED_FAILURES:
        return False
    return wilson(fixed, base_failures).high < 1.0 - effect_ratio


def baseline_reproduces(k0: int, n0: int) -> bool:
    """The failure reproduces: the baseline's 95% interval excludes a zero failure rate."""
    return n0 > 0 and k0 > 0 and wilson(k0, n0).low > 0.0
