"""Decision rules (pure): what proves a fix, when a parked incident is due, which status a
decision moves the incident to. The records and queries they read are in kb.repo.decisions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import date

from scipy.stats import fisher_exact

from kb.domain.triggers import TriggerState
from kb.jsontypes import JsonObject

__all__ = [
    "ALLOWED_FROM",
    "BASELINE_ARM",
    "REVISIT_ARM",
    "SIGNIFICANCE",
    "STATUS_AFTER",
    "ArmCounts",
    "FixCheck",
    "ParkedIncident",
    "one_sided_p",
    "request_of",
]


SIGNIFICANCE = 0.05

REVISIT_ARM = "revisit"

BASELINE_ARM = "baseline"

STATUS_AFTER = {"PARKED": "parked", "FIXED": "fixed", "REOPENED": "reopened"}

ALLOWED_FROM = {
    "PARKED": ("open", "parked", "reopened"),
    "FIXED": ("open", "parked", "reopened"),
    "REOPENED": ("fixed", "closed"),
}


@dataclass(frozen=True)
class ArmCounts:
    """Failures out of n replays, from one or more arm evidence rows."""

    evidence_keys: tuple[str, ...]
    failures: int
    n: int
    arm: str = ""

    @property
    def rate(self) -> float:
        return self.failures / self.n if self.n else 0.0

    def describe(self) -> str:
        keys = ", ".join(self.evidence_keys)
        return f"{self.failures}/{self.n} ({self.rate:.0%}) [{keys}]"


def one_sided_p(run: ArmCounts, baseline: ArmCounts) -> float:
    """Fisher exact p that the run fails less often than the baseline."""
    table = [
        [run.failures, run.n - run.failures],
        [baseline.failures, baseline.n - baseline.failures],
    ]
    return float(fisher_exact(table, alternative="less").pvalue)


@dataclass(frozen=True)
class FixCheck:
    """Whether the record proves a fix, and if not, what is missing."""

    verified: bool
    baseline: ArmCounts | None
    run: ArmCounts | None
    p_value: float | None
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.verified and self.run and self.baseline:
            return (
                f"failure rate {self.run.describe()} on the current stack vs baseline "
                f"{self.baseline.describe()}, one-sided Fisher p = {self.p_value:.2g}"
            )
        return "; ".join(self.missing)

    def evidence_keys(self) -> list[str]:
        keys = list(self.baseline.evidence_keys) if self.baseline else []
        if self.run:
            keys += [k for k in self.run.evidence_keys if k not in keys]
        return keys


@dataclass(frozen=True)
class ParkedIncident:
    """A parked incident: when and why to look again, and whether that time has come."""

    slug: str
    title: str
    parked_on: date | None
    decided_by: str
    rationale: str
    tradeoff: str
    fix: str
    revisit_on: date | None
    triggers: tuple[TriggerState, ...]
    state: str  # waiting | due | overdue
    reasons: tuple[str, ...]
    days_overdue: int = 0
    last_revisit: str | None = None
    evidence_keys: tuple[str, ...] = field(default_factory=tuple)

    @property
    def due(self) -> bool:
        return self.state in ("due", "overdue")

    def to_dict(self) -> JsonObject:
        data = asdict(self)
        data["parked_on"] = self.parked_on.isoformat() if self.parked_on else None
        data["revisit_on"] = self.revisit_on.isoformat() if self.revisit_on else None
        data["due"] = self.due
        data["triggers"] = [
            {**asdict(t), "evidence_keys": list(t.evidence_keys)} for t in self.triggers
        ]
        data["reasons"] = list(self.reasons)
        data["evidence_keys"] = list(self.evidence_keys)
        return data


def request_of(payload: JsonObject) -> JsonObject | None:
    exchange = payload.get("exchange")
    for holder in (exchange, payload):
        if isinstance(holder, dict) and isinstance(holder.get("request"), dict):
            request = holder["request"]
            if isinstance(request.get("messages"), list):
                return dict(request)
    return None
