"""Operating characteristics of the arm decision rules, by simulation (no server).

A simulated triage is one arm against the baseline, replayed in seed-matched pairs and
examined at the engine's looks with `triage.stats` exactly as the engine calls it: it stops at
the first look where the rule says "removes", "unchanged" or "no-baseline-failure", else at the
cap ("undecided"). For every baseline failure rate and arm effect (the arm's rate is the
baseline's times 1, 0.5 or 0) it reports how often each verdict comes out and the requests
spent (baseline + arm replies of that one arm).

The fixed-N design with the same error rates is computed exactly, not simulated: N replays of
baseline and arm, tested once: "removes" when the one-sided Fisher p is below alpha (false
confirmations <= alpha, like the sequential rule's), "unchanged" when the pairs' statistic
k1 - effect_ratio * k0 exceeds its alpha-critical value under a fourfold cut (calibrated at
the true baseline rate, which a real test cannot do: generous to the fixed design). N is the
smallest giving at least the power the sequential rule shows for both verdicts (the lower 95%
Wilson bounds of its simulated "removes" share on removed arms and "unchanged" share on arms
without effect). Its cost is 2N whatever the effect. Wald's lower bound on the expected
requests of any sequential rule with those error rates shows where a target ratio to 2N
cannot be met by any rule.

`python -m triage.simulate` (or `make sim`) prints the table; seeded, so reproducible.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.stats import binom, hypergeom

from triage import stats

BASE_RATES = (1.0, 0.6, 0.35, 0.2, 0.1, 0.05)
EFFECTS = {"none": 1.0, "halved": 0.5, "removed": 0.0}
VERDICTS = ("removes", "unchanged", "no-baseline-failure", "undecided")
DEFAULT_TRIAGES = 4000
DEFAULT_SEED = 20261201
MAX_FIXED_N = 2000


@dataclass(frozen=True)
class Design:
    """A decision rule (see `triage.stats.RULES`) at a look schedule."""

    rule: str
    looks: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.rule} @ {','.join(map(str, self.looks))}"


@dataclass(frozen=True)
class Cell:
    """One design at one baseline rate and arm effect."""

    design: Design
    base_rate: float
    effect: str
    triages: int
    counts: dict[str, int]  # verdict -> triages
    mean_requests: float
    p95_requests: float
    coupling: float = 0.0  # the chance a seed drives both replies of its pair

    @property
    def arm_rate(self) -> float:
        return self.base_rate * EFFECTS[self.effect]

    def share(self, verdict: str) -> float:
        return self.counts.get(verdict, 0) / self.triages

    def share_interval(self, verdict: str) -> stats.Interval:
        return stats.wilson(self.counts.get(verdict, 0), self.triages)


def simulate_cell(
    design: Design,
    base_rate: float,
    effect: str,
    *,
    triages: int,
    rng: np.random.Generator,
    coupling: float = 0.0,
) -> Cell:
    """`triages` simulated triages of one arm. `coupling` is the chance that a seed drives
    both sides of its pair (the arm then fails only on a seed the baseline fails on, at the
    same marginal rate); otherwise the two replies are independent."""
    if effect not in EFFECTS:
        raise ValueError(f"unknown effect {effect!r}; expected one of {', '.join(EFFECTS)}")
    if not 0.0 <= coupling <= 1.0:
        raise ValueError(f"coupling must be in [0, 1], got {coupling}")
    cap = design.looks[-1]
    arm_rate = base_rate * EFFECTS[effect]
    base = rng.random((triages, cap)) < base_rate
    arm = rng.random((triages, cap)) < arm_rate
    if coupling > 0:
        coupled = base & (rng.random((triages, cap)) < (arm_rate / base_rate if base_rate else 0))
        arm = np.where(rng.random((triages, cap)) < coupling, coupled, arm)
    return evaluate(design, base_rate, effect, base, arm, coupling=coupling)


def evaluate(
    design: Design,
    base_rate: float,
    effect: str,
    base: np.ndarray,
    arm: np.ndarray,
    *,
    coupling: float = 0.0,
) -> Cell:
    """Apply the design to given replay outcomes (rows: triages, columns: seed index);
    `coupling` is recorded for the fixed design the cell is compared with."""
    triages = base.shape[0]
    verdict, stopped_at = stops(design, base, arm)
    requests = 2 * stopped_at
    counts = {v: int(np.sum(verdict == v)) for v in VERDICTS}
    return Cell(
        design,
        base_rate,
        effect,
        triages,
        counts,
        float(requests.mean()),
        float(np.percentile(requests, 95)),
        coupling,
    )


def stops(design: Design, base: np.ndarray, arm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per triage (row): the arm's verdict and the replays at which it stopped."""
    triages = base.shape[0]
    k0_all = np.cumsum(base, axis=1)
    k1_all = np.cumsum(arm, axis=1)
    both_all = np.cumsum(base & arm, axis=1)
    verdict = np.full(triages, "undecided", dtype=object)
    stopped_at = np.full(triages, design.looks[-1])
    open_ = np.ones(triages, dtype=bool)
    for n in design.looks:
        idx = np.flatnonzero(open_)
        if idx.size == 0:
            break
        k0, k1, both = k0_all[idx, n - 1], k1_all[idx, n - 1], both_all[idx, n - 1]
        decided = _decide(design, n, k0, k1, both)
        done = decided != "undecided"
        verdict[idx[done]] = decided[done]
        stopped_at[idx[done]] = n
        open_[idx[done]] = False
    return verdict, stopped_at


def _decide(design: Design, n: int, k0: np.ndarray, k1: np.ndarray, both: np.ndarray) -> np.ndarray:
    if design.rule == "e-value":
        decided: np.ndarray = stats.evalue_decisions(
            k0, np.full_like(k0, n), k1 - both, k0 - both, both
        )
        return decided
    # Other rules: `stats.compare` itself, once per distinct state.
    states = np.stack([k0, k1, both], axis=1)
    unique, inverse = np.unique(states, axis=0, return_inverse=True)
    decisions = np.array(
        [
            _compare_decision(design.rule, len(design.looks), int(a), n, int(b), int(c))
            for a, b, c in unique
        ],
        dtype=object,
    )
    return decisions[inverse.reshape(-1)]


@functools.lru_cache(maxsize=None)
def _compare_decision(rule: str, looks: int, k0: int, n: int, k1: int, both: int) -> str:
    return stats.compare(k0, n, k1, n, looks=looks, paired=(k0, k0 - both), rule=rule).decision


# -- the fixed-N design -----------------------------------------------------------------------
def fixed_power(n: int, base_rate: float, arm_rate: float, alpha: float = stats.ALPHA) -> float:
    """Exact P(one-sided Fisher p < alpha) for n baseline and n arm replays: "removes"."""
    k = np.arange(n + 1)
    k0, k1 = np.meshgrid(k, k, indexing="ij")
    # fisher_exact(alternative="less") on [[k1, n-k1], [k0, n-k0]] is this hypergeometric cdf.
    p_less = hypergeom.cdf(k1, 2 * n, k0 + k1, n)
    weights = np.outer(binom.pmf(k, n, base_rate), binom.pmf(k, n, arm_rate))
    return float(np.sum(weights[p_less < alpha]))


def _unchanged_statistic(n: int, effect_ratio: float) -> np.ndarray:
    """den * k1 - num * k0 >= 0 on the (k0, k1) grid, effect_ratio = num / den: an integer
    form of k1 - effect_ratio * k0, the sum of the pairs' Y of `stats.unchanged_evalue`."""
    ratio = Fraction(effect_ratio).limit_denominator(100)
    k = np.arange(n + 1)
    k0, k1 = np.meshgrid(k, k, indexing="ij")
    return ratio.denominator * k1 - ratio.numerator * k0 + ratio.numerator * n


def _tail(n: int, statistic: np.ndarray, base_rate: float, arm_rate: float) -> np.ndarray:
    """P(statistic >= t) for every integer t in its range."""
    k = np.arange(n + 1)
    weights = np.outer(binom.pmf(k, n, base_rate), binom.pmf(k, n, arm_rate))
    mass = np.bincount(statistic.ravel(), weights=weights.ravel())
    return np.cumsum(mass[::-1])[::-1]


def _paired_tail(n: int, base_rate: float, arm_rate: float, coupling: float) -> np.ndarray:
    """P(statistic >= t) for n pairs whose seed drives both replies with chance `coupling`
    (then the arm fails only on a seed the baseline fails on, at its own rate), otherwise
    independent replies. The statistic is `_unchanged_statistic`'s, summed pair by pair."""
    ratio = Fraction(stats.EFFECT_RATIO).limit_denominator(100)
    num, den = ratio.numerator, ratio.denominator
    a, p = arm_rate, base_rate
    share = a / p if p else 0.0
    joint = {  # (baseline failed, arm failed) -> probability of the pair
        (1, 1): coupling * p * share + (1 - coupling) * p * a,
        (1, 0): coupling * p * (1 - share) + (1 - coupling) * p * (1 - a),
        (0, 1): (1 - coupling) * (1 - p) * a,
        (0, 0): coupling * (1 - p) + (1 - coupling) * (1 - p) * (1 - a),
    }
    pair = np.zeros(num + den + 1)
    for (b, f), q in joint.items():
        pair[den * f - num * b + num] += q  # den*k1 - num*k0 + num*n, one pair's share
    mass, power = np.array([1.0]), pair
    while n:  # n-fold convolution by squaring
        if n & 1:
            mass = np.convolve(mass, power)
        power, n = np.convolve(power, power), n >> 1
    return np.cumsum(mass[::-1])[::-1]


def unchanged_threshold(
    n: int,
    base_rate: float,
    alpha: float = stats.ALPHA,
    effect_ratio: float = stats.EFFECT_RATIO,
    coupling: float = 0.0,
) -> int:
    """Critical value of the fixed design's one-shot "unchanged" test: the smallest t with
    P(statistic >= t) <= alpha when the arm cuts the rate exactly effect_ratio-fold (a smaller
    cut only lowers the tail). Calibrated at the true baseline rate, which a real test does
    not know: generous to the fixed design, so the comparison does not flatter the sequential
    rule. With `coupling` the null is calibrated at that coupling, as generous."""
    if coupling > 0:
        tail = _paired_tail(n, base_rate, effect_ratio * base_rate, coupling)
    else:
        statistic = _unchanged_statistic(n, effect_ratio)
        tail = _tail(n, statistic, base_rate, effect_ratio * base_rate)
    return int(np.flatnonzero(tail <= alpha)[0]) if np.any(tail <= alpha) else len(tail)


def fixed_unchanged_power(
    n: int, base_rate: float, arm_rate: float, alpha: float = stats.ALPHA, coupling: float = 0.0
) -> float:
    """Exact P(the fixed design says "unchanged") for n baseline and n arm replays, paired
    seeds driving both replies with chance `coupling` (a paired one-shot test: it gains from
    concordant failures as the sequential bet does)."""
    if coupling > 0:
        tail = _paired_tail(n, base_rate, arm_rate, coupling)
    else:
        tail = _tail(n, _unchanged_statistic(n, stats.EFFECT_RATIO), base_rate, arm_rate)
    threshold = unchanged_threshold(n, base_rate, alpha, coupling=coupling)
    return float(tail[threshold]) if threshold < len(tail) else 0.0


def matched_fixed_n(
    base_rate: float,
    power: float,
    alpha: float = stats.ALPHA,
    limit: int = MAX_FIXED_N,
    unchanged_power: float = 0.0,
    coupling: float = 0.0,
) -> int | None:
    """Smallest N whose fixed design says "removes" with at least `power` when the arm removes
    the failure and "unchanged" with at least `unchanged_power` when it has no effect (None:
    not within `limit`). Power is not monotone in N for discrete tests; this is the first N
    that reaches both."""

    def enough(n: int) -> bool:
        return fixed_power(n, base_rate, 0.0, alpha) >= power and (
            unchanged_power <= 0
            or fixed_unchanged_power(n, base_rate, base_rate, alpha, coupling) >= unchanged_power
        )

    n, step = 2, 1
    while n <= limit:
        if enough(n):
            break
        n += step
        step = min(step + 1, 16) if n > 64 else 1
    else:
        return None
    # Coarse steps above 64: walk back to the first N that reaches it.
    while n > 2 and enough(n - 1):
        n -= 1
    return n


# -- the lower bound for any rule ------------------------------------------------------------
def _bernoulli_kl(a: float, b: float) -> float:
    out = 0.0
    if a > 0:
        out += a * np.log(a / b)
    if a < 1:
        out += (1 - a) * np.log((1 - a) / (1 - b))
    return float(out)


def wald_bound(
    base_rate: float, arm_rate: float, null_ratio: float, power: float, alpha: float = stats.ALPHA
) -> float:
    """Fewest expected requests (baseline + arm, in pairs) of ANY sequential rule that has
    error rate <= alpha under the null "arm rate = null_ratio x baseline rate" and says the
    other thing with probability `power` at (base_rate, arm_rate): Wald's inequality
    E[pairs] >= ((1-b) ln((1-b)/alpha) + b ln(b/(1-alpha))) / KL, b = 1 - power, with KL the
    information per pair against the least favourable null rate."""

    def kl(p: float) -> float:
        return _bernoulli_kl(base_rate, p) + _bernoulli_kl(arm_rate, min(null_ratio * p, 1 - 1e-12))

    info = minimize_scalar(kl, bounds=(1e-9, 1 - 1e-9), method="bounded").fun
    beta = min(max(1.0 - power, 0.0), 1.0 - alpha)
    needed = (1 - beta) * np.log((1 - beta) / alpha)
    if beta > 0:
        needed += beta * np.log(beta / (1 - alpha))
    return float(2 * max(needed, 0.0) / info)


# -- whole triages: one baseline shared by every arm -------------------------------------------
TRIAGE_ARMS = ("removed", "none", "none", "none", "none")  # one cause and four bystanders


@dataclass(frozen=True)
class TriageCell:
    """Whole triages at one baseline rate: the baseline replayed once for all arms (up to
    the last arm still running, as the engine's scheduler does), each arm stopped at its own
    verdict; against the fixed design with a shared baseline, (arms + 1) x N requests."""

    design: Design
    base_rate: float
    arms: tuple[str, ...]
    triages: int
    mean_requests: float
    p95_requests: float
    baseline_share: float  # of the sequential requests, the baseline's
    correct: float  # every arm's verdict right (removed: removes; none: unchanged)


def simulate_triages(
    design: Design,
    base_rate: float,
    arms: Sequence[str] = TRIAGE_ARMS,
    *,
    triages: int,
    rng: np.random.Generator,
    coupling: float = 0.0,
) -> TriageCell:
    """`triages` simulated triages of several arms against one shared baseline."""
    cap = design.looks[-1]
    base = rng.random((triages, cap)) < base_rate
    arm_n, baseline_n, right = [], np.zeros(triages, dtype=int), np.ones(triages, dtype=bool)
    for effect in arms:
        arm_rate = base_rate * EFFECTS[effect]
        arm = rng.random((triages, cap)) < arm_rate
        if coupling > 0:
            ratio = arm_rate / base_rate if base_rate else 0.0
            coupled = base & (rng.random((triages, cap)) < ratio)
            arm = np.where(rng.random((triages, cap)) < coupling, coupled, arm)
        verdict, stopped_at = stops(design, base, arm)
        arm_n.append(stopped_at)
        baseline_n = np.maximum(baseline_n, stopped_at)
        want = {"removed": "removes", "none": "unchanged"}.get(effect)
        if want is not None:
            right &= verdict == want
    requests = baseline_n + np.sum(arm_n, axis=0)
    return TriageCell(
        design,
        base_rate,
        tuple(arms),
        triages,
        float(requests.mean()),
        float(np.percentile(requests, 95)),
        float(baseline_n.sum() / requests.sum()),
        float(right.mean()),
    )


def format_triages(cells: Sequence[Cell], triage_cells: Sequence[TriageCell]) -> str:
    """Markdown: whole triages with a shared baseline vs the fixed design with a shared
    baseline at the N matched per arm in `cells` ((arms + 1) x N)."""
    fixed = _fixed_costs(cells)
    lines = []
    for design in dict.fromkeys(t.design for t in triage_cells):
        arms = next(t.arms for t in triage_cells if t.design == design)
        lines += [
            f"whole triages, rule {design.rule}, looks at {_looks(design.looks)}, arms "
            f"{', '.join(arms)}, one shared baseline:",
            "",
            "| base rate | all verdicts right | mean req | p95 req | baseline share | "
            "fixed (arms+1) x N | mean / fixed |",
            "|---|---|---|---|---|---|---|",
        ]
        for cell in (t for t in triage_cells if t.design == design):
            n_fixed = fixed.get((design, cell.base_rate))
            total = (len(cell.arms) + 1) * n_fixed if n_fixed else None
            lines.append(
                f"| {cell.base_rate:g} | {_pct(cell.correct)} | {cell.mean_requests:.1f} | "
                f"{cell.p95_requests:.0f} | {_pct(cell.baseline_share)} | {total or '-'} | "
                f"{f'{cell.mean_requests / total:.2f}' if total else '-'} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# -- the table -------------------------------------------------------------------------------
def run(
    designs: Sequence[Design],
    *,
    base_rates: Sequence[float] = BASE_RATES,
    effects: Sequence[str] = tuple(EFFECTS),
    triages: int = DEFAULT_TRIAGES,
    seed: int = DEFAULT_SEED,
    coupling: float = 0.0,
) -> list[Cell]:
    """Every design at every rate and effect; each cell on its own seeded stream, and every
    design sees the same replay outcomes in a cell (common random numbers)."""
    cells = []
    for i, base_rate in enumerate(base_rates):
        for j, effect in enumerate(effects):
            for design in designs:
                rng = np.random.default_rng([seed, i, j])
                cells.append(
                    simulate_cell(
                        design, base_rate, effect, triages=triages, rng=rng, coupling=coupling
                    )
                )
    return cells


def format_table(cells: Sequence[Cell]) -> str:
    """Markdown, one block per design: verdict shares and requests per rate and effect, and
    the fixed-N design with the same error rates (2N requests) with the ratio of the means.

    "removes" on an arm without effect is a false confirmation, "unchanged" on an arm that
    removes the failure a false rejection; "no repro" is the rule giving up because the
    baseline shows no failure. "bound / 2N": Wald's lower bound on the mean requests of any
    sequential rule with the same error rates and power, over the fixed design's 2N."""
    fixed = _fixed_costs(cells)
    lines = []
    for design in dict.fromkeys(cell.design for cell in cells):
        lines += [
            f"rule {design.rule}, looks at {_looks(design.looks)}:",
            "",
            "| base rate | arm effect | removes | unchanged | no repro | undecided | "
            "mean req | p95 req | fixed 2N | mean / 2N | bound / 2N |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for cell in (c for c in cells if c.design == design):
            n_fixed = fixed.get((design, cell.base_rate))
            ratio = f"{cell.mean_requests / (2 * n_fixed):.2f}" if n_fixed else "-"
            bound = _bound(cell)
            floor = f"{bound / (2 * n_fixed):.2f}" if n_fixed and bound else "-"
            lines.append(
                f"| {cell.base_rate:g} | {cell.effect} | "
                f"{_pct(cell.share('removes'))} | {_pct(cell.share('unchanged'))} | "
                f"{_pct(cell.share('no-baseline-failure'))} | "
                f"{_pct(cell.share('undecided'))} | {cell.mean_requests:.1f} | "
                f"{cell.p95_requests:.0f} | {2 * n_fixed if n_fixed else '-'} | {ratio} | "
                f"{floor} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _bound(cell: Cell) -> float | None:
    """Wald's lower bound for any rule with this cell's error rates (None: halved arms, where
    neither verdict is the right one, and seed-coupled pairs: the bound's information per
    pair assumes independent replies)."""
    if cell.coupling > 0:
        return None
    if cell.effect == "removed":
        return wald_bound(cell.base_rate, 0.0, 1.0, cell.share_interval("removes").low)
    if cell.effect == "none":
        return wald_bound(
            cell.base_rate, cell.base_rate, stats.EFFECT_RATIO, cell.share_interval("unchanged").low
        )
    return None


def _looks(looks: Sequence[int]) -> str:
    steps = {b - a for a, b in zip(looks, looks[1:], strict=False)}
    if len(looks) > 5 and len(steps) <= 2:
        return f"{looks[0]}, {looks[1]}, ... {looks[-1]} (every {looks[1] - looks[0]})"
    return ", ".join(map(str, looks))


def false_confirmation(cells: Sequence[Cell], design: Design) -> dict[float, Cell]:
    """Per baseline rate, the cell where the arm has no effect (its "removes" share)."""
    return {c.base_rate: c for c in cells if c.design == design and c.effect == "none"}


def _fixed_costs(cells: Sequence[Cell]) -> dict[tuple[Design, float], int]:
    """Per design and baseline rate: N of the fixed design matched to the powers shown (the
    lower 95% Wilson bounds of the simulated "removes" share when the arm removes the failure
    and "unchanged" share when it has no effect)."""
    by_key = {(c.design, c.base_rate, c.effect): c for c in cells}
    out = {}
    for (design, base_rate, effect), cell in by_key.items():
        if effect != "removed":
            continue
        power = cell.share_interval("removes").low
        none = by_key.get((design, base_rate, "none"))
        unchanged = none.share_interval("unchanged").low if none else 0.0
        n_fixed = (
            matched_fixed_n(base_rate, power, unchanged_power=unchanged, coupling=cell.coupling)
            if max(power, unchanged) > stats.ALPHA
            else None
        )
        if n_fixed:
            out[(design, base_rate)] = n_fixed
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


PREVIOUS_LOOKS = tuple(stats.look_schedule(stats.DEFAULT_CAP, doubling=True))  # used before
DESIGNS = (
    Design("bonferroni", PREVIOUS_LOOKS),  # the rule before issue 15
    Design("e-value", PREVIOUS_LOOKS),  # the new rule at the old looks
    Design("e-value", tuple(stats.look_schedule(stats.DEFAULT_CAP))),  # the engine's default
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage.simulate", description=__doc__)
    parser.add_argument("--triages", type=int, default=DEFAULT_TRIAGES)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--coupling",
        type=float,
        default=0.0,
        help="chance that a seed drives both replies of its pair (default 0)",
    )
    args = parser.parse_args(argv)
    if not 10 <= args.triages <= 1_000_000:
        parser.error("--triages must be between 10 and 1000000")
    if not 0.0 <= args.coupling <= 1.0:
        parser.error("--coupling must be between 0 and 1")
    started = time.monotonic()
    cells = run(DESIGNS, triages=args.triages, seed=args.seed, coupling=args.coupling)
    print(format_table(cells))
    engine = DESIGNS[-1]
    triage_cells = [
        simulate_triages(
            engine,
            base_rate,
            triages=args.triages,
            rng=np.random.default_rng([args.seed, i, 99]),
            coupling=args.coupling,
        )
        for i, base_rate in enumerate(BASE_RATES)
    ]
    print(format_triages([c for c in cells if c.design == engine], triage_cells))
    print(
        f"\n{args.triages} simulated triages per cell, seed {args.seed}, "
        f"coupling {args.coupling:g}, "
        f"{time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
