"""Pure checks over one exchange: what is wrong with it, and where.

`classify` runs every symptom check in the catalogue (`catalogue().checks`: the built-ins
in triage/checks/ and any plugin's, in number order) over one `View` of the exchange and
returns their `Finding`s; a failed finding is a symptom. Nothing here does I/O, and
nothing raises on a strange exchange: a check that cannot apply passes with a reason that
says so. `KINDS`, `USER_FACING_KINDS`, `DIAGNOSTIC_KINDS` and `CHECKS` are read from the
catalogue too, so a plugin's check counts everywhere a built-in one does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

# The package, not its function: the process-wide catalogue is looked up per call.
from triage import catalogue as plugins
from triage.capture import Exchange

# Thresholds stay importable from here (`X as X`: explicit re-exports).
from triage.checks.base import (
    LENGTH_FINISH_REASONS as LENGTH_FINISH_REASONS,
)
from triage.checks.base import (
    MAX_SCAN_CHARS as MAX_SCAN_CHARS,
)
from triage.checks.base import (
    REASONING_DOMINANT_SHARE as REASONING_DOMINANT_SHARE,
)
from triage.checks.base import (
    REASONING_MAJORITY_SHARE as REASONING_MAJORITY_SHARE,
)
from triage.checks.base import (
    RUNAWAY_NGRAM as RUNAWAY_NGRAM,
)
from triage.checks.base import (
    RUNAWAY_REPEAT_SHARE as RUNAWAY_REPEAT_SHARE,
)
from triage.checks.base import (
    RUNAWAY_WINDOW_CHARS as RUNAWAY_WINDOW_CHARS,
)
from triage.checks.base import (
    SHORT_CONTENT_CHARS as SHORT_CONTENT_CHARS,
)
from triage.checks.base import (
    TIMEOUT_STATUSES as TIMEOUT_STATUSES,
)
from triage.checks.base import (
    Check,
    CheckFn,
    Finding,
    FunctionCheck,
    View,
    check,
    view,
)
from triage.checks.content import repeated_ngram_share

if TYPE_CHECKING:
    from triage.catalogue import Catalogue

__all__ = [
    "CHECKS",  # noqa: F822 (module __getattr__)
    "DIAGNOSTIC_KINDS",  # noqa: F822 (module __getattr__)
    "KINDS",  # noqa: F822 (module __getattr__)
    "USER_FACING_KINDS",  # noqa: F822 (module __getattr__)
    "Check",
    "Finding",
    "FunctionCheck",
    "View",
    "check",
    "classify",
    "failure_kinds",
    "is_failure",
    "repeated_ngram_share",
    "symptoms",
    "view",
]


class _Plan(NamedTuple):
    """What classify needs from one catalogue, computed once per catalogue."""

    catalogue: object
    runs: tuple[CheckFn, ...]
    kinds: tuple[str, ...]
    user_facing: frozenset[str]
    checks: dict[str, CheckFn]


_plan: _Plan | None = None


def _current(catalogue: Catalogue | None = None) -> _Plan:
    """The plan of `catalogue` (default: the process-wide one); cached, not rebuilt per call."""
    global _plan
    if catalogue is None:
        catalogue = plugins.catalogue()
    plan = _plan
    if plan is not None and plan.catalogue is catalogue:
        return plan
    ordered = sorted(catalogue.checks, key=lambda entry: entry.number)
    plan = _Plan(
        catalogue=catalogue,
        # A FunctionCheck's function directly: one call less per check per exchange.
        runs=tuple(
            entry.func if isinstance(entry, FunctionCheck) else entry.run for entry in ordered
        ),
        kinds=tuple(entry.id for entry in ordered),
        user_facing=frozenset(entry.id for entry in ordered if entry.user_facing),
        checks={entry.id: entry.run for entry in ordered},
    )
    _plan = plan
    return plan


def __getattr__(name: str) -> Any:
    # Module attributes read from the catalogue on first use (PEP 562), so that importing
    # this module never loads the plugins.
    if name == "KINDS":
        return _current().kinds
    if name == "USER_FACING_KINDS":
        return _current().user_facing
    if name == "DIAGNOSTIC_KINDS":
        plan = _current()
        return frozenset(plan.kinds) - plan.user_facing
    if name == "CHECKS":
        return dict(_current().checks)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def classify(
    exchange: Exchange | Mapping[str, Any], *, catalogue: Catalogue | None = None
) -> list[Finding]:
    """All findings (passed and failed) for one exchange, in the checks' number order."""
    exchange_view = view(exchange)
    findings: list[Finding] = []
    for run in _current(catalogue).runs:
        findings.extend(run(exchange_view))
    return findings


def symptoms(exchange: Exchange | Mapping[str, Any]) -> list[Finding]:
    """Only the failed findings."""
    return [f for f in classify(exchange) if not f.passed]


def failure_kinds(exchange: Exchange | Mapping[str, Any]) -> set[str]:
    """Kinds of all failed findings (user-facing and diagnostic)."""
    return {f.kind for f in classify(exchange) if not f.passed}


def is_failure(exchange: Exchange | Mapping[str, Any]) -> bool:
    """Whether a reply is broken for its user: any failed finding of a user-facing kind."""
    return bool(failure_kinds(exchange) & _current().user_facing)
