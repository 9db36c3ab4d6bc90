"""Honest statistics for intermittent failures: Wilson intervals, Fisher's exact test and a
group-sequential rule that stops an arm as soon as the data decide it.

The sequential rule compares an arm (the failing request with one candidate cause removed)
against the baseline replay of the same request:

* "removes": the arm fails significantly less often than the baseline. One-sided Fisher
  exact p below alpha / looks (Bonferroni over the planned looks, so peeking at every look
  keeps the overall false-positive rate at or below alpha).
* "unchanged": the data exclude the effect that removing the cause would have. The arm has
  at least MIN_UNCHANGED_N replays and the lower 95% Wilson bound of its failure rate is
  above `effect_ratio` times the upper 95% Wilson bound of the baseline's: even the most
  favourable reading of the data leaves the arm failing at more than that fraction of the
  baseline. This is the "enough power to have seen a difference" condition: a reduction to
  that fraction would have been detected. With seed-matched replays (the engine pairs every
  arm's replay i with the baseline's replay i) the same claim is also made from the pairs: of
  the baseline's failing replays (at least MIN_PAIRED_FAILURES), the share the arm fixed has an
  upper 95% bound below 1 - effect_ratio.
* otherwise "undecided", and the arm gets more replays at the next look, up to the cap.

Looks are at 4, 8, 16, 32, ... replays: a deterministic failure (temperature 0) is decided
within the first two looks (4 vs 4: one-sided p = 0.014; 8 vs 8: p = 8e-5), an intermittent
one takes more.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import binomtest, fisher_exact

ALPHA = 0.05
FIRST_LOOK = 4
DEFAULT_CAP = 64
# "Removing the cause removes the symptom" means at least a fourfold drop in the failure rate;
# an arm that provably keeps more than a quarter of the baseline's rate is "unchanged".
EFFECT_RATIO = 0.25
# "Unchanged" is a claim about the absence of an effect: never made on fewer replays than this,
# even when a handful of failures already bound the rate (e.g. 3/4 failing).
MIN_UNCHANGED_N = 8
# The paired form of "unchanged" needs at least this many baseline failures to look at.
MIN_PAIRED_FAILURES = 4


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4)]


def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for k failures in n trials (n = 0: the whole [0, 1])."""
    if n <= 0:
        return Interval(0.0, 1.0)
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(float(ci.low), float(ci.high))


def fisher_less(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided Fisher exact p that the arm (k1/n1) fails less often than baseline (k0/n0)."""
    if n0 <= 0 or n1 <= 0:
        return 1.0
    table = [[k1, n1 - k1], [k0, n0 - k0]]
    return float(fisher_exact(table, alternative="less").pvalue)


def fisher_two_sided(k1: int, n1: int, k0: int, n0: int) -> float:
    """Two-sided Fisher exact p of arm vs baseline (reported next to every arm)."""
    if n0 <= 0 or n1 <= 0:
        return 1.0
    return float(fisher_exact([[k1, n1 - k1], [k0, n0 - k0]]).pvalue)


def look_schedule(cap: int = DEFAULT_CAP, first: int = FIRST_LOOK) -> list[int]:
    """Cumulative sample sizes at which an arm is examined: first, 2*first, ... capped."""
    cap = max(cap, 1)
    sizes = []
    n = min(first, cap)
    while n < cap:
        sizes.append(n)
        n *= 2
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
) -> Comparison:
    """Decide an arm against the baseline at one look (see the module docstring).

    `paired` = (baseline failures among seed-matched pairs, how many of those the arm fixed).
    """
    alpha_per_look = alpha / max(looks, 1)
    p_less = fisher_less(k1, n1, k0, n0)
    p_two = fisher_two_sided(k1, n1, k0, n0)
    baseline_ci = wilson(k0, n0)
    arm_ci = wilson(k1, n1)
    if n0 > 0 and n1 > 0 and p_less < alpha_per_look:
        decision = "removes"
    elif n1 >= MIN_UNCHANGED_N and n0 > 0 and (
        arm_ci.low > effect_ratio * baseline_ci.high or _paired_unchanged(paired, effect_ratio)
    ):
        decision = "unchanged"
    elif n0 > 0 and k0 == 0 and baseline_ci.high < 0.5:
        # The baseline itself does not reproduce: nothing can be removed.
        decision = "no-baseline-failure"
    else:
        decision = "undecided"
    return Comparison(k0, n0, k1, n1, p_less, p_two, alpha_per_look, decision)


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

