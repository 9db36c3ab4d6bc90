"""The Diagnosis: the result of one engine run, as typed records.

Built by the engine (triage.engine.diagnosis), stored as `TriageRun.result`, written by
`triage diagnose --json`, read back by `triage show`. Each record has ONE `to_json()` --
the JSON as stored and written, unchanged from the dicts used before these records existed,
key for key and in the same order -- and `from_json()` for stored rows (tolerant of older
rows: missing optional keys take their defaults). The engine checks the JSON against
`kb/schemas/diagnosis.schema.json` once, where it records it (`validate_diagnosis`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kb.domain.records import ArmSummary
from kb.jsontypes import JsonObject

__all__ = [
    "Diagnosis",
    "DiagnosisArm",
    "DiagnosisCause",
    "DiagnosisError",
    "Finding",
    "GraphSummary",
    "Observation",
    "OverallVerdict",
    "Reproduction",
    "ReproductionSignature",
    "RunCost",
    "ServerSummary",
    "SkippedArm",
    "StackSummary",
    "failed_kinds",
    "validate_diagnosis",
]


class DiagnosisError(ValueError):
    """A diagnosis that does not match its schema (names the JSON path)."""


def _known_fields(cls: type, data: JsonObject) -> JsonObject:
    """The keys of `data` that are fields of dataclass `cls` (a stored row may carry keys a
    newer or older writer added; missing optional ones take their defaults)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _strings(values: Any) -> list[str]:
    return [str(v) for v in values or []]


@dataclass(frozen=True)
class Finding:
    """One check's verdict on the failing exchange, as a diagnosis (and the run's plan, and
    the exchange's evidence) holds it. `where` points into the exchange."""

    kind: str
    passed: bool
    score: float
    reason: str
    where: str | int | None = None
    # The model-file lint's findings carry their `offset` key (null for a whole file); the
    # exchange's findings are recorded without it -- as stored before these records.
    offset: int | None = None
    has_offset: bool = False

    def to_json(self) -> JsonObject:
        data: JsonObject = {
            "kind": self.kind,
            "passed": self.passed,
            "score": self.score,
            "reason": self.reason,
            "where": self.where,
        }
        if self.has_offset:
            data["offset"] = self.offset
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> Finding:
        offset = data.get("offset")
        return cls(
            kind=str(data["kind"]),
            passed=bool(data.get("passed", True)),
            score=float(data.get("score", 0.0) or 0.0),
            reason=str(data.get("reason", "") or ""),
            where=data.get("where"),
            offset=int(offset) if isinstance(offset, int) else None,
            has_offset="offset" in data,
        )


def failed_kinds(findings: Sequence[Finding]) -> list[str]:
    """The kinds of the findings that failed, in order."""
    return [f.kind for f in findings if not f.passed]


@dataclass(frozen=True)
class ServerSummary:
    """A server configuration as the diagnosis names it (secret flag values masked)."""

    binary: str | None
    model: str | None
    args: list[str]
    url: str | None

    def to_json(self) -> JsonObject:
        return {
            "binary": self.binary,
            "model": self.model,
            "args": list(self.args),
            "url": self.url,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> ServerSummary:
        return cls(
            binary=data.get("binary"),
            model=data.get("model"),
            args=_strings(data.get("args")),
            url=data.get("url"),
        )


@dataclass(frozen=True)
class StackSummary:
    """The stack as the diagnosis shows it."""

    server: ServerSummary | None
    speculative: bool = False
    alternate_model: str | None = None
    alternate_binary: str | None = None
    known_good: ServerSummary | None = None
    # A drill's host workaround (e.g. --no-repack on an AMX host); None for a user's stack.
    host_workaround: str | None = None

    def to_json(self) -> JsonObject:
        return {
            "server": self.server.to_json() if self.server else None,
            "speculative": self.speculative,
            "alternate_model": self.alternate_model,
            "alternate_binary": self.alternate_binary,
            "known_good": self.known_good.to_json() if self.known_good else None,
            "host_workaround": self.host_workaround,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> StackSummary:
        server, known_good = data.get("server"), data.get("known_good")
        return cls(
            server=ServerSummary.from_json(server) if isinstance(server, dict) else None,
            speculative=bool(data.get("speculative", False)),
            alternate_model=data.get("alternate_model"),
            alternate_binary=data.get("alternate_binary"),
            known_good=ServerSummary.from_json(known_good)
            if isinstance(known_good, dict)
            else None,
            host_workaround=data.get("host_workaround"),
        )


@dataclass(frozen=True)
class Observation:
    """One observation of the run (a check's facts: its own keys, `name` among them) with
    the key of the evidence it was stored as."""

    # As the observing check reported them: each check (a plugin's too) has its own keys.
    facts: dict[str, Any]
    evidence: str | None = None

    @property
    def name(self) -> str:
        return str(self.facts.get("name", ""))

    def to_json(self) -> JsonObject:
        return {**self.facts, "evidence": self.evidence}

    @classmethod
    def from_json(cls, data: JsonObject) -> Observation:
        facts = {k: v for k, v in data.items() if k != "evidence"}
        return cls(facts, data.get("evidence"))


@dataclass(frozen=True)
class RunCost:
    """What the run cost: replays, wall-clock, server and launch seconds."""

    requests: int
    wall_seconds: float
    server_seconds: float
    launch_seconds: float

    def to_json(self) -> JsonObject:
        return asdict(self)  # the stored keys are the fields, in field order

    @classmethod
    def from_json(cls, data: JsonObject) -> RunCost:
        return cls(
            requests=int(data.get("requests", 0) or 0),
            wall_seconds=float(data.get("wall_seconds", 0.0) or 0.0),
            server_seconds=float(data.get("server_seconds", 0.0) or 0.0),
            launch_seconds=float(data.get("launch_seconds", 0.0) or 0.0),
        )


@dataclass(frozen=True)
class ReproductionSignature:
    """The captured failure the baseline must reproduce (finding kinds, finish reason,
    HTTP status class as "5xx")."""

    kinds: list[str]
    finish_reason: str | None = None
    status_class: str | None = None

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> ReproductionSignature:
        return cls(_strings(data.get("kinds")), data.get("finish_reason"), data.get("status_class"))


@dataclass(frozen=True)
class Reproduction:
    """The reproduction gate's outcome: did the baseline show the captured failure."""

    reproduced: bool
    message: str
    signature: ReproductionSignature | None = None

    def to_json(self) -> JsonObject:
        data: JsonObject = {"reproduced": self.reproduced, "message": self.message}
        if self.signature is not None:
            data["signature"] = self.signature.to_json()
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> Reproduction:
        signature = data.get("signature")
        return cls(
            reproduced=bool(data.get("reproduced", True)),
            message=str(data.get("message", "") or ""),
            signature=ReproductionSignature.from_json(signature)
            if isinstance(signature, dict)
            else None,
        )


@dataclass(frozen=True)
class GraphSummary:
    """The cause graph's counts: nodes and edges, by kind, relation and cause status."""

    nodes: int
    edges: int
    nodes_by_kind: dict[str, int] | None = None
    edges_by_relation: dict[str, int] | None = None
    causes_by_status: dict[str, int] | None = None

    def to_json(self) -> JsonObject:
        data: JsonObject = {"nodes": self.nodes, "edges": self.edges}
        for name in ("nodes_by_kind", "edges_by_relation", "causes_by_status"):
            counts = getattr(self, name)
            if counts is not None:
                data[name] = dict(counts)
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> GraphSummary:
        def counts(name: str) -> dict[str, int] | None:
            value = data.get(name)
            return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else None

        return cls(
            nodes=int(data.get("nodes", 0) or 0),
            edges=int(data.get("edges", 0) or 0),
            nodes_by_kind=counts("nodes_by_kind"),
            edges_by_relation=counts("edges_by_relation"),
            causes_by_status=counts("causes_by_status"),
        )


@dataclass(frozen=True)
class SkippedArm:
    """An arm not run because it cannot matter for this stack and request (issue 23)."""

    arm: str
    reason: str

    def to_json(self) -> JsonObject:
        return {"arm": self.arm, "reason": self.reason}

    @classmethod
    def from_json(cls, data: JsonObject) -> SkippedArm:
        return cls(str(data["arm"]), str(data.get("reason", "")))


@dataclass(frozen=True)
class OverallVerdict:
    """The run's overall verdict (issue 23): explained (a cause confirmed), unexplained (the
    failure reproduced, no cause confirmed: what was ruled out and what to try next), or
    the run's state (not-reproduced, partial)."""

    status: str
    headline: str
    # Request fields whose removal alone removed the failure (request-field ablation arms).
    request_fields: list[str] = field(default_factory=list)
    ruled_out: str | None = None
    next_probes: list[str] | None = None

    def to_json(self) -> JsonObject:
        data: JsonObject = {"status": self.status, "headline": self.headline}
        if self.request_fields:
            data["request_fields"] = list(self.request_fields)
        if self.ruled_out is not None:
            data["ruled_out"] = self.ruled_out
        if self.next_probes is not None:
            data["next_probes"] = list(self.next_probes)
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> OverallVerdict:
        probes = data.get("next_probes")
        ruled_out = data.get("ruled_out")
        return cls(
            status=str(data.get("status", "")),
            headline=str(data.get("headline", "")),
            request_fields=_strings(data.get("request_fields")),
            ruled_out=None if ruled_out is None else str(ruled_out),
            next_probes=None if probes is None else _strings(probes),
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

    def to_json(self) -> JsonObject:
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
    def from_json(cls, data: JsonObject) -> DiagnosisArm:
        n, failures = int(data.get("n", 0) or 0), int(data.get("failures", 0) or 0)
        return cls(
            **{
                **_known_fields(cls, data),
                "name": str(data["name"]),
                "variant": str(data.get("variant", "")),
                "level": str(data.get("level", "request")),
                "n": n,
                "failures": failures,
                "rate": data.get("rate", round(failures / n, 4) if n else None),
                "ci95": [float(x) for x in data.get("ci95") or [0.0, 1.0]],
                "p_value": data.get("p_value"),
                "decision": str(data.get("decision", "undecided")),
            }
        )


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

    def to_json(self) -> JsonObject:
        return asdict(self)  # the stored keys are the fields, in field order

    @classmethod
    def from_json(cls, data: JsonObject) -> DiagnosisCause:
        return cls(
            **{
                **_known_fields(cls, data),
                "id": str(data["id"]),
                "status": str(data.get("status", "suspected")),
                "rationale": str(data.get("rationale", "")),
                "evidence": _strings(data.get("evidence")),
            }
        )


@dataclass
class Diagnosis:
    """The result of one engine run."""

    incident: str
    run_id: int | None
    generated_at: str
    findings: list[Finding]
    arms: list[DiagnosisArm]
    causes: list[DiagnosisCause]
    graph: GraphSummary
    exchange_evidence: str | None = None
    stack: StackSummary | None = None  # None: an older result that did not record it
    observations: list[Observation] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    cost: RunCost | None = None  # None: an older result that did not record it
    # Added with the reproduction gate; absent in older stored results.
    state: str = "done"  # done | partial | not-reproduced
    reproduction: Reproduction | None = None
    schema_version: int = 1
    # Arms not run because they cannot matter here (issue 23).
    skipped_arms: list[SkippedArm] = field(default_factory=list)
    # The run's overall verdict (issue 23); absent in older ones.
    verdict: OverallVerdict | None = None

    def to_json(self) -> JsonObject:
        """The diagnosis JSON (the stored row, `--json`)."""
        data: JsonObject = {
            "schema_version": self.schema_version,
            "incident": self.incident,
            "run_id": self.run_id,
            "exchange_evidence": self.exchange_evidence,
            "findings": [f.to_json() for f in self.findings],
            "stack": self.stack.to_json() if self.stack is not None else {},
            "arms": [a.to_json() for a in self.arms],
            "observations": [o.to_json() for o in self.observations],
            "causes": [c.to_json() for c in self.causes],
            "undecided": list(self.undecided),
            "graph": self.graph.to_json(),
            "cost": self.cost.to_json() if self.cost is not None else {},
            "state": self.state,
        }
        if self.generated_at:
            data["generated_at"] = self.generated_at
        if self.reproduction is not None:
            data["reproduction"] = self.reproduction.to_json()
        if self.skipped_arms:
            data["skipped_arms"] = [s.to_json() for s in self.skipped_arms]
        if self.verdict is not None:
            data["verdict"] = self.verdict.to_json()
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> Diagnosis:
        """A stored diagnosis (older rows: missing optional keys take their defaults)."""
        stack, cost = data.get("stack"), data.get("cost")
        reproduction, verdict = data.get("reproduction"), data.get("verdict")
        return cls(
            incident=str(data["incident"]),
            run_id=data.get("run_id"),
            generated_at=str(data.get("generated_at", "")),
            findings=[Finding.from_json(f) for f in data.get("findings") or []],
            arms=[DiagnosisArm.from_json(a) for a in data.get("arms") or []],
            causes=[DiagnosisCause.from_json(c) for c in data.get("causes") or []],
            graph=GraphSummary.from_json(data.get("graph") or {}),
            exchange_evidence=data.get("exchange_evidence"),
            stack=StackSummary.from_json(stack) if stack else None,
            observations=[Observation.from_json(o) for o in data.get("observations") or []],
            undecided=_strings(data.get("undecided")),
            cost=RunCost.from_json(cost) if cost else None,
            state=str(data.get("state", "done")),
            reproduction=Reproduction.from_json(reproduction) if reproduction else None,
            schema_version=int(data.get("schema_version", 1)),
            skipped_arms=[SkippedArm.from_json(s) for s in data.get("skipped_arms") or []],
            verdict=OverallVerdict.from_json(verdict) if verdict else None,
        )

    @property
    def verdict_status(self) -> str | None:
        return self.verdict.status if self.verdict is not None else None


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
