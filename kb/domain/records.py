"""Typed records passed between layers, one writer each.

- `Reply`: one replayed request as scored by the engine (evidence payload `type: reply`);
  written by the engine's replayer, read back on `--resume`.
- `ArmSummary`: one probe arm's k/n with its interval and decision (evidence payload
  `type: arm`); written by the engine's recorder, read by decisions, retro, graph and UI.
- The Diagnosis built from them, and its parts, are in kb.domain.diagnosis.

Each record has `to_dict()` (the stored JSON, unchanged from the dicts used before these
records existed) and `from_dict()` (tolerant of older rows: missing optional keys default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kb.jsontypes import JsonObject

__all__ = [
    "ArmSummary",
    "RAW_TEXT_LIMIT",
    "Reply",
]

RAW_TEXT_LIMIT = 4000  # characters of each reply's text kept in evidence


@dataclass
class Reply:
    """One replayed request of one arm: failed or not, and why."""

    arm: str
    index: int
    seed: int
    failed: bool
    kinds: list[str]
    finish_reason: str | None
    content_chars: int
    reasoning_chars: int
    status: int | None
    elapsed_s: float
    timings: dict[str, Any]
    raw_misplaced: bool = False
    error: str = ""
    text: str = ""  # committed text (reasoning + content + tool calls), for divergence

    def to_dict(self) -> JsonObject:
        return {
            "type": "reply",
            "arm": self.arm,
            "index": self.index,
            "seed": self.seed,
            "failed": self.failed,
            "kinds": self.kinds,
            "finish_reason": self.finish_reason,
            "content_chars": self.content_chars,
            "reasoning_chars": self.reasoning_chars,
            "status": self.status,
            "elapsed_s": round(self.elapsed_s, 4),
            "timings": self.timings,
            "raw_misplaced": self.raw_misplaced,
            "error": self.error,
            "text": self.text[:RAW_TEXT_LIMIT],
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> Reply:
        return cls(
            arm=str(data["arm"]),
            index=int(data["index"]),
            seed=int(data["seed"]),
            failed=bool(data["failed"]),
            kinds=[str(k) for k in data.get("kinds") or []],
            finish_reason=data.get("finish_reason"),
            content_chars=int(data.get("content_chars", 0) or 0),
            reasoning_chars=int(data.get("reasoning_chars", 0) or 0),
            status=data.get("status"),
            elapsed_s=float(data.get("elapsed_s", 0.0) or 0.0),
            timings=dict(data.get("timings") or {}),
            raw_misplaced=bool(data.get("raw_misplaced", False)),
            error=str(data.get("error", "") or ""),
            text=str(data.get("text", "") or ""),
        )

    def summary(self) -> str:
        """The one-line evidence summary of this reply."""
        verdict = "FAIL " + ",".join(self.kinds) if self.failed else "ok"
        return (
            f"{self.arm} #{self.index} seed {self.seed}: {verdict} "
            f"(finish={self.finish_reason}, content {self.content_chars} chars, "
            f"reasoning {self.reasoning_chars} chars)"
        )


@dataclass
class ArmSummary:
    """One probe arm as measured: k/n, Wilson 95% interval, p vs baseline, decision."""

    arm: str
    variant: str
    level: str
    n: int
    failures: int
    rate: float | None
    ci95: list[float]
    p_value: float | None
    p_less: float | None
    decision: str
    stopped: str = ""
    errors: int = 0
    error: str = ""
    log_tail: str = ""
    kinds: dict[str, int] = field(default_factory=dict)
    speed_tok_s: float | None = None
    server_seconds: float = 0.0
    launch_seconds: float = 0.0
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_acceptance: float | None = None

    def to_dict(self) -> JsonObject:
        return {
            "type": "arm",
            "arm": self.arm,
            "variant": self.variant,
            "level": self.level,
            "n": self.n,
            "failures": self.failures,
            "rate": self.rate,
            "ci95": list(self.ci95),
            "p_value": self.p_value,
            "p_less": self.p_less,
            "decision": self.decision,
            "stopped": self.stopped,
            "errors": self.errors,
            "error": self.error,
            "log_tail": self.log_tail,
            "kinds": dict(self.kinds),
            "speed_tok_s": self.speed_tok_s,
            "server_seconds": self.server_seconds,
            "launch_seconds": self.launch_seconds,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "draft_acceptance": self.draft_acceptance,
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> ArmSummary:
        n, failures = int(data.get("n", 0) or 0), int(data.get("failures", 0) or 0)
        return cls(
            arm=str(data["arm"]),
            variant=str(data.get("variant", "")),
            level=str(data.get("level", "request")),
            n=n,
            failures=failures,
            rate=data.get("rate", round(failures / n, 4) if n else None),
            ci95=[float(x) for x in data.get("ci95") or [0.0, 1.0]],
            p_value=data.get("p_value"),
            p_less=data.get("p_less"),
            decision=str(data.get("decision", "undecided")),
            stopped=str(data.get("stopped", "") or ""),
            errors=int(data.get("errors", 0) or 0),
            error=str(data.get("error", "") or ""),
            log_tail=str(data.get("log_tail", "") or ""),
            kinds={str(k): int(v) for k, v in (data.get("kinds") or {}).items()},
            speed_tok_s=data.get("speed_tok_s"),
            server_seconds=float(data.get("server_seconds", 0.0) or 0.0),
            launch_seconds=float(data.get("launch_seconds", 0.0) or 0.0),
            draft_n=int(data.get("draft_n", 0) or 0),
            draft_n_accepted=int(data.get("draft_n_accepted", 0) or 0),
            draft_acceptance=data.get("draft_acceptance"),
        )

    def evidence_summary(self) -> str:
        """The one-line evidence summary of this arm."""
        low, high = self.ci95
        return (
            f"arm {self.arm} ({self.variant}): {self.failures}/{self.n} failed, "
            f"95% CI {low:.2f}-{high:.2f}"
            + (
                f", one-sided p={self.p_less:.2g}"
                if self.p_less is not None
                else (f", p={self.p_value}" if self.p_value is not None else "")
            )
            + f"; {self.decision}"
            + (f"; error: {self.error}" if self.error else "")
        )
