"""Failure signatures and change detection for live traffic (pure: counts in, verdicts out).

A failure signature is what two failing exchanges must share to count as the same failure:
the sorted user-facing failing finding kinds plus the status class (`2xx`, `4xx`, `5xx`, or
`transport` when the proxy itself answered because the upstream was down or slow).

Change detection compares the current window of one model x signature with the trailing
window before it using Wald's sequential probability ratio test on the current window's
k failures out of n exchanges:

    H0: p = p0, the trailing rate's upper 95% Wilson bound (at least FLOOR_RATE), i.e. the
        most the failure could have happened before, given what was seen;
    H1: p = p1 = max(RISE_FACTOR * p0, p0 + MIN_RISE), a rise worth an incident.

The log likelihood ratio log L(p1)/L(p0) is compared with Wald's boundaries
log((1 - beta) / alpha) (alarm: the signature is new or its rate rose) and
log(beta / (1 - alpha)) (no change). The test is re-run as exchanges arrive; its boundaries
keep the false-alarm rate near alpha per window without a fixed rate threshold, and the
alarm also needs MIN_FAILURES failures: one failing exchange never opens an incident.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from scipy.stats import binom

from triage.stats import wilson

ALPHA = 0.01
BETA = 0.05
FLOOR_RATE = 0.01
RISE_FACTOR = 2.0
MIN_RISE = 0.05
MIN_FAILURES = 3


def status_class(status: int | None, *, transport: bool = False) -> str:
    """`transport` when the proxy answered for an unreachable/slow upstream, else `Nxx`."""
    if transport or status is None:
        return "transport"
    return f"{status // 100}xx"


def failure_signature(kinds: Iterable[str], status: int | None, *, transport: bool = False) -> str:
    """`kind+kind|class` for a failing exchange; "" for a working one (no failing kinds)."""
    failing = sorted(set(kinds))
    if not failing:
        return ""
    return "+".join(failing) + "|" + status_class(status, transport=transport)


def signature_kinds(signature: str) -> list[str]:
    kinds, _, _ = signature.partition("|")
    return [k for k in kinds.split("+") if k]


@dataclass(frozen=True)
class Detection:
    """One run of the sequential test on a model x signature."""

    failures: int
    n: int
    trailing_failures: int
    trailing_n: int
    p0: float
    p1: float
    llr: float
    upper: float
    lower: float
    verdict: str  # alarm | no-change | continue
    new: bool  # the trailing window never saw this signature

    @property
    def alarm(self) -> bool:
        return self.verdict == "alarm"

    @property
    def interval(self) -> list[float]:
        return wilson(self.failures, self.n).as_list()

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["rate"] = {
            "failures": self.failures,
            "n": self.n,
            "rate": round(self.failures / self.n, 4) if self.n else 0.0,
            "interval": self.interval,
        }
        return data


def detect(
    failures: int,
    n: int,
    trailing_failures: int,
    trailing_n: int,
    *,
    alpha: float = ALPHA,
    beta: float = BETA,
) -> Detection:
    """Run the SPRT of the current window (failures/n) against the trailing window."""
    if not 0 <= failures <= n or not 0 <= trailing_failures <= trailing_n:
        raise ValueError("counts must satisfy 0 <= failures <= n")
    p0 = max(FLOOR_RATE, wilson(trailing_failures, trailing_n).high if trailing_n else FLOOR_RATE)
    p0 = min(p0, 0.98)
    p1 = min(max(RISE_FACTOR * p0, p0 + MIN_RISE), 0.99)
    llr = float(binom.logpmf(failures, n, p1) - binom.logpmf(failures, n, p0)) if n else 0.0
    upper = math.log((1 - beta) / alpha)
    lower = math.log(beta / (1 - alpha))
    if llr >= upper and failures >= MIN_FAILURES:
        verdict = "alarm"
    elif llr <= lower:
        verdict = "no-change"
    else:
        verdict = "continue"
    return Detection(
        failures=failures,
        n=n,
        trailing_failures=trailing_failures,
        trailing_n=trailing_n,
        p0=round(p0, 6),
        p1=round(p1, 6),
        llr=round(llr, 4),
        upper=round(upper, 4),
        lower=round(lower, 4),
        verdict=verdict,
        new=trailing_failures == 0,
    )
