"""Typed records passed between layers, one writer each.

- `Reply`: one replayed request as scored by the engine (evidence payload `type: reply`);
  written by the engine's replayer, read back on `--resume`.
- `ArmSummary`: one probe arm's k/n with its interval and decision (evidence payload
  `type: arm`); written by the engine's recorder, read by decisions, retro, graph and UI.
- `Diagnosis`: the result of one run (`TriageRun.result`, `triage diagnose --json`);
  built by the engine and validated against `kb/schemas/diagnosis.schema.json` there.

Each record has `to_dict()` (the stored JSON, unchanged from the dicts used before these
records existed) and `from_dict()` (tolerant of older rows: missing optional keys default).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kb.jsontypes import JsonObject

__all__ = [
    "ArmSummary",
    "Diagnosis",
    "DiagnosisArm",
    "DiagnosisCause",
    "DiagnosisError",
    "RAW_TEXT_LIMIT",
    "Reply",
    "validate_diagnosis",
]

RAW_TEXT_LIMIT = 4000  # characters of each reply's text kept in evidence


def _known_fields(cls: type, data: JsonObject) -> JsonObject:
    """The keys of `data` that are fields of dataclass `cls` (a stored row may carry keys a
    newer or older writer added; missing optional ones take their defaults)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


class DiagnosisError(ValueError):
    """A diagnosis that does not match its schema (names the JSON path)."""


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


@dataclass
class DiagnosisArm:
    """One row of the diagnosis' arms table."""

    name: str
    variant: str
    level: str
    n: int
    failures: int
    rate: float | None
    ci95: list[float]
    p_value: float | None
    decision: str
    stopped: str = ""
    error: str | None = None
    speed_tok_s: float | None = None
    draft_acceptance: float | None = None
    evidence: str | None = None
    # One-sided p (the arm fails less than the baseline): the one the decision uses;
    # `p_value` is the two-sided Fisher p kept for older readers.
    p_less: float | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)  # the stored keys are the fields, in field order

    @classmethod
    def from_summary(cls, summary: ArmSummary, evidence: str | None) -> DiagnosisArm:
        return cls(
            name=summary.arm,
            variant=summary.variant,
            level=summary.level,
            n=summary.n,
            failures=summary.failures,
            rate=summary.rate,
            ci95=list(summary.ci95),
            p_value=summary.p_value,
            decision=summary.decision,
            stopped=summary.stopped,
            error=summary.error or None,
            speed_tok_s=summary.speed_tok_s,
            draft_acceptance=summary.draft_acceptance,
            evidence=evidence,
            p_less=summary.p_less,
        )

    @classmethod
    def from_dict(cls, data: JsonObject) -> DiagnosisArm:
        return cls(**_known_fields(cls, data))


@dataclass
class DiagnosisCause:
    """One cause verdict of the diagnosis."""

    id: str
    status: str
    rationale: str
    evidence: list[str]
    deciding_probe: str = ""
    previous_status: str | None = None
    undecided: str | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)  # the stored keys are the fields, in field order

    @classmethod
    def from_dict(cls, data: JsonObject) -> DiagnosisCause:
        return cls(**_known_fields(cls, data))


@dataclass
class Diagnosis:
    """The result of one engine run."""

    incident: str
    run_id: int | None
    generated_at: str
    findings: list[dict[str, Any]]
    arms: list[DiagnosisArm]
    causes: list[DiagnosisCause]
    graph: dict[str, Any]
    exchange_evidence: str | None = None
    stack: dict[str, Any] = field(default_factory=dict)
    observations: list[dict[str, Any]] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    # Added with the reproduction gate; absent in older stored results.
    state: str = "done"  # done | partial | not-reproduced
    reproduction: dict[str, Any] | None = None
    schema_version: int = 1
    # Arms not run because they cannot matter here (issue 23): {"arm", "reason"}.
    skipped_arms: list[dict[str, str]] = field(default_factory=list)
    # The run's overall verdict (issue 23): {"status": explained | unexplained | ...,
    # "headline", and when unexplained "ruled_out" and "next_probes"}; absent in older ones.
    verdict: dict[str, Any] | None = None

    def to_dict(self) -> JsonObject:
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "incident": self.incident,
            "run_id": self.run_id,
            "exchange_evidence": self.exchange_evidence,
            "findings": list(self.findings),
            "stack": dict(self.stack),
            "arms": [a.to_dict() for a in self.arms],
            "observations": list(self.observations),
            "causes": [c.to_dict() for c in self.causes],
            "undecided": list(self.undecided),
            "graph": dict(self.graph),
            "cost": dict(self.cost),
            "state": self.state,
        }
        if self.generated_at:
            data["generated_at"] = self.generated_at
        if self.reproduction is not None:
            data["reproduction"] = dict(self.reproduction)
        if self.skipped_arms:
            data["skipped_arms"] = [dict(s) for s in self.skipped_arms]
        if self.verdict is not None:
            data["verdict"] = dict(self.verdict)
        return data

    @classmethod
    def from_dict(cls, data: JsonObject) -> Diagnosis:
        return cls(
            incident=str(data["incident"]),
            run_id=data.get("run_id"),
            generated_at=str(data.get("generated_at", "")),
            findings=list(data.get("findings") or []),
            arms=[DiagnosisArm.from_dict(a) for a in data.get("arms") or []],
            causes=[DiagnosisCause.from_dict(c) for c in data.get("causes") or []],
            graph=dict(data.get("graph") or {"nodes": 0, "edges": 0}),
            exchange_evidence=data.get("exchange_evidence"),
            stack=dict(data.get("stack") or {}),
            observations=list(data.get("observations") or []),
            undecided=list(data.get("undecided") or []),
            cost=dict(data.get("cost") or {}),
            state=str(data.get("state", "done")),
            reproduction=data.get("reproduction"),
            schema_version=int(data.get("schema_version", 1)),
            skipped_arms=[dict(s) for s in data.get("skipped_arms") or []],
            verdict=data.get("verdict"),
        )

    def validated(self) -> JsonObject:
        """`to_dict()`, checked against the diagnosis schema (DiagnosisError if it breaks)."""
        data = self.to_dict()
        validate_diagnosis(data)
        return data


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = json.loads(
        resources.files("kb").joinpath("schemas/diagnosis.schema.json").read_text("utf-8")
    )
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def validate_diagnosis(data: JsonObject) -> None:
    """Raise DiagnosisError naming the JSON path if `data` breaks the diagnosis schema."""
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        raise DiagnosisError(
            f"diagnosis does not match its schema at {error.json_path}: {error.message}"
        )
