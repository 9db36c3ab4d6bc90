"""What a diagnosis starts from (`Intake`): the request to replay, the captured exchange as
stored (none when reproducing from a request alone) and its findings (the checks'
findings as the diagnosis's `Finding` records: triage.checks.base.Finding.record)."""

from __future__ import annotations

from dataclasses import dataclass

from kb.domain.diagnosis import Finding
from kb.jsontypes import JsonObject
from triage.capture import Exchange
from triage.symptoms import classify

__all__ = ["Intake", "exchange_findings"]


def exchange_findings(exchange: Exchange) -> list[Finding]:
    """The exchange's findings (triage.symptoms.classify) as the diagnosis holds them."""
    return [f.record() for f in classify(exchange)]


@dataclass(frozen=True)
class Intake:
    """One failing exchange to diagnose: the request the replays send, the exchange as
    stored as evidence (None: reproduce from the request alone, no captured failure) and
    its findings (the failure signature the baseline must reproduce)."""

    request: JsonObject
    exchange: JsonObject | None = None
    findings: tuple[Finding, ...] = ()

    @classmethod
    def of(cls, exchange: Exchange) -> Intake:
        """A captured exchange, classified."""
        return cls(exchange.request, exchange.to_dict(), tuple(exchange_findings(exchange)))
