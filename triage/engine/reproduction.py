"""The reproduction gate: the captured exchange's failure signature (finding kinds, finish
reason, HTTP status class) must be reproduced by the baseline before any cause moves.

Pure. Replies that fail differently -- the replay itself refused (4xx), the server not
reachable, another symptom -- are named in the gate's message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kb.domain.diagnosis import Finding, ReproductionSignature, failed_kinds
from kb.jsontypes import JsonObject

__all__ = ["Signature", "gate_message"]

GATEWAY_KIND = "gateway-error"
SERVER_FAILURE_KINDS = frozenset({"server-crash", "server-hang"})


@dataclass(frozen=True)
class Signature:
    """What the captured failure looked like. Empty when reproducing from a request alone
    (then any user-visible failure of the baseline counts as the failure)."""

    kinds: frozenset[str] = frozenset()
    finish_reason: str | None = None
    status_class: int | None = None  # 2 for 2xx, 5 for 5xx, ...

    @classmethod
    def from_findings(cls, findings: Sequence[Finding], exchange: JsonObject | None) -> Signature:
        kinds = frozenset(failed_kinds(findings))
        status = exchange.get("status") if exchange else None
        finish = None
        response = (exchange or {}).get("response")
        if isinstance(response, dict):
            try:
                finish = response["choices"][0].get("finish_reason")
            except (KeyError, IndexError, TypeError, AttributeError):
                finish = None
        return cls(
            kinds,
            finish if isinstance(finish, str) else None,
            status // 100 if isinstance(status, int) and status >= 100 else None,
        )

    def facts(self) -> ReproductionSignature:
        """The signature as the run's plan and the diagnosis show it (status class "5xx")."""
        return ReproductionSignature(
            sorted(self.kinds),
            self.finish_reason,
            f"{self.status_class}xx" if self.status_class else None,
        )

    def matches(self, reply: Any) -> bool:
        """Does a failing reply show this failure?"""
        if not reply.failed or reply.error:
            return False
        status = reply.status if isinstance(reply.status, int) else None
        if (
            self.status_class is not None
            and status is not None
            and status // 100 != self.status_class
        ):
            return False
        if self.status_class in (None, 2) and status is not None and 400 <= status < 500:
            return False  # the replay itself was refused: not the captured failure
        kinds = set(reply.kinds)
        if GATEWAY_KIND in self.kinds and kinds & SERVER_FAILURE_KINDS:
            # A gateway's error page is what its client sees when the server behind it
            # crashed or hung: a replay (direct) whose server crashed or hung reproduces it.
            return True
        return not self.kinds or bool(self.kinds & kinds)


def _describe(reply: Any) -> str:
    if reply.error:
        return f"no reply ({reply.error[:160]})"
    if isinstance(reply.status, int) and reply.status >= 400:
        return f"HTTP {reply.status}"
    return (
        "failed with "
        + (", ".join(reply.kinds) or "no finding")
        + (f" (finish {reply.finish_reason})" if reply.finish_reason else "")
    )


def gate_message(signature: Signature, baseline: Any) -> str | None:
    """None when the baseline's replies so far are consistent with the captured failure
    (some reproduce it, or none failed yet); otherwise why the run must stop."""
    replies = list(baseline.replies)
    if not replies:
        return None
    if baseline.error:
        return f"the baseline server failed: {baseline.error}"
    if any(signature.matches(r) for r in replies):
        return None
    different = [r for r in replies if r.error or r.failed]
    if not different:
        return None  # nothing failed yet: the rules report "did not reproduce"
    counts = Counter(_describe(r) for r in different)
    shown = "; ".join(f"{n}x {text}" for text, n in counts.most_common(3))
    wanted = ", ".join(sorted(signature.kinds)) or "a failing reply"
    if signature.status_class:
        wanted += f" (HTTP {signature.status_class}xx)"
    return (
        f"the failure did not reproduce: the captured exchange shows {wanted}, but "
        f"{len(different)}/{len(replies)} baseline replays failed differently: {shown}. "
        "No cause was moved; fix the request or the stack and run again"
    )
