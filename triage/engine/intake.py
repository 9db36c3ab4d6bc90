"""What a diagnosis starts from: a captured exchange, its findings as the diagnosis JSON
holds them (the one place findings become JSON), and `diagnose_exchange` -- the one entry
the CLI, the UI, the demo and the drills call with an exchange."""

from __future__ import annotations

from typing import Any

from kb.repo.store import Store
from triage.capture import Exchange
from triage.engine.events import ProgressFn
from triage.engine.runner import DiagnoseOptions, Diagnoser
from triage.stackfile import Stack
from triage.symptoms import classify

__all__ = ["FINDING_KEYS", "diagnose_exchange", "findings_json"]

# The fields of a finding in the diagnosis JSON (and the run's recorded plan).
FINDING_KEYS = ("kind", "passed", "score", "reason", "where")


def findings_json(exchange: Exchange) -> list[dict[str, Any]]:
    """The exchange's findings (triage.symptoms.classify) as the diagnosis JSON holds them."""
    return [{k: f.to_dict().get(k) for k in FINDING_KEYS} for f in classify(exchange)]


def diagnose_exchange(
    store: Store,
    exchange: Exchange,
    stack: Stack,
    *,
    incident: str | None = None,
    options: DiagnoseOptions | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Classify the failing exchange and diagnose it against the stack; the diagnosis JSON."""
    return Diagnoser(
        store,
        stack,
        exchange.request,
        exchange=exchange.to_dict(),
        findings=findings_json(exchange),
        incident=incident,
        options=options,
        progress=progress,
    ).run()
