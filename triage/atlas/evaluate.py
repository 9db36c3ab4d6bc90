"""Precision and recall of the atlas matcher on held-out cases.

    python -m triage.atlas.evaluate [CASES_DIR] [--atlas DIR] [--json]

Each case is a folder with `case.yaml` (`input`, `kind: capture|log`, `expect: [ids]`,
optional `build`) and its input file; the default CASES_DIR is tests/fixtures/atlas_eval.
The input is matched against the atlas as `triage atlas match` does (the case's `build`,
when given, as `--build`), and the top three matches are scored:

- precision: share of the returned matches whose id is in the case's `expect`;
- recall: share of the cases with a non-empty `expect` that have an expected id among
  their top three;
- false alarms: cases with `expect: []` that got any match.

Each rate is printed as k/n with its Wilson 95% interval. It lives in triage (not kb)
because reading a capture needs the capture layer and the symptom checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kb.atlas import AtlasEntry, AtlasError, Facts, atlas_dirs, load_atlas, match_atlas
from kb.jsontypes import JsonObject, JsonValue
from kb.service.settings import InputTooLarge, load_yaml, read_bounded
from triage.atlas.facts import facts_from_exchange, facts_from_log, facts_from_stack, merge_facts
from triage.atlas.report import read_log_file
from triage.capture import CaptureError, load_file
from triage.stats import wilson
from triage.symptoms import classify

__all__ = [
    "CaseResult",
    "Evaluation",
    "EvaluationError",
    "Rate",
    "evaluate",
    "load_case_facts",
    "main",
]

DEFAULT_CASES = Path("tests/fixtures/atlas_eval")
MAX_CASE_BYTES = 64 * 1024
MAX_CASES = 2000
KINDS = ("capture", "log")


class EvaluationError(ValueError):
    """A case that cannot be read; the message names its file and field."""


@dataclass(frozen=True)
class CaseResult:
    """One case: what was expected and which entries came back (best first)."""

    case: str
    kind: str
    expect: tuple[str, ...]
    returned: tuple[str, ...]
    scores: tuple[float, ...]

    @property
    def hit(self) -> bool:
        return bool(set(self.expect) & set(self.returned))


@dataclass
class Evaluation:
    """The counts behind precision, recall and false alarms."""

    results: list[CaseResult] = field(default_factory=list)

    @property
    def returned(self) -> int:
        return sum(len(r.returned) for r in self.results)

    @property
    def correct(self) -> int:
        return sum(len(set(r.returned) & set(r.expect)) for r in self.results)

    @property
    def positives(self) -> list[CaseResult]:
        return [r for r in self.results if r.expect]

    @property
    def negatives(self) -> list[CaseResult]:
        return [r for r in self.results if not r.expect]

    @property
    def precision(self) -> float | None:
        return self.correct / self.returned if self.returned else None

    @property
    def recall(self) -> float | None:
        positives = self.positives
        return sum(r.hit for r in positives) / len(positives) if positives else None

    @property
    def false_alarms(self) -> int:
        return sum(1 for r in self.negatives if r.returned)

    @property
    def precision_rate(self) -> Rate:
        return Rate(self.correct, self.returned)

    @property
    def recall_rate(self) -> Rate:
        return Rate(sum(r.hit for r in self.positives), len(self.positives))

    @property
    def false_alarm_rate(self) -> Rate:
        return Rate(self.false_alarms, len(self.negatives))

    def to_dict(self) -> JsonObject:
        return {
            "cases": len(self.results),
            "precision": self.precision_rate.to_json(),
            "recall": self.recall_rate.to_json(),
            "false_alarms": self.false_alarm_rate.to_json(),
            "results": [
                {
                    "case": r.case,
                    "kind": r.kind,
                    "expect": list(r.expect),
                    "returned": list(r.returned),
                    "scores": [round(s, 2) for s in r.scores],
                    "hit": r.hit,
                }
                for r in self.results
            ],
        }


@dataclass(frozen=True)
class Rate:
    """k of n with its Wilson 95% interval."""

    k: int
    n: int

    @property
    def share(self) -> float | None:
        return round(self.k / self.n, 4) if self.n else None

    def to_json(self) -> JsonObject:
        return {
            "k": self.k,
            "n": self.n,
            "rate": self.share,
            "ci95": wilson(self.k, self.n).as_list(),
        }

    def text(self) -> str:
        """`k/n = 0.83  (95% CI 0.55-0.95)`, or `k/n  (no cases)`."""
        if self.share is None:
            return f"{self.k}/{self.n}  (no cases)"
        low, high = wilson(self.k, self.n).as_list()
        return f"{self.k}/{self.n} = {self.share:.2f}  (95% CI {low:.2f}-{high:.2f})"


def _case_field(data: JsonObject, key: str, file: Path) -> JsonValue:
    if key not in data:
        raise EvaluationError(f"{file}: $.{key}: missing")
    return data[key]


def load_case_facts(folder: Path) -> tuple[str, tuple[str, ...], Facts]:
    """(kind, expected ids, facts) of one case folder; raises EvaluationError."""
    file = folder / "case.yaml"
    try:
        data = load_yaml(read_bounded(file, MAX_CASE_BYTES).decode("utf-8"))
    except (OSError, InputTooLarge, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EvaluationError(f"{file}: $: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise EvaluationError(f"{file}: $: must be a YAML mapping")
    kind = _case_field(data, "kind", file)
    if kind not in KINDS:
        raise EvaluationError(f"{file}: $.kind: {kind!r} is not one of {', '.join(KINDS)}")
    expect = _case_field(data, "expect", file) or []
    if not isinstance(expect, list) or not all(isinstance(e, str) for e in expect):
        raise EvaluationError(f"{file}: $.expect: must be a list of entry ids")
    name = _case_field(data, "input", file)
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise EvaluationError(f"{file}: $.input: must be a file name beside case.yaml")
    build = data.get("build")
    if build is not None and (not isinstance(build, int) or isinstance(build, bool)):
        raise EvaluationError(f"{file}: $.build: must be a build number")
    path = folder / name
    if kind == "log":
        try:
            facts = facts_from_log(read_log_file(path))
        except OSError as exc:
            raise EvaluationError(f"{path}: $: cannot read the log: {exc}") from None
    else:
        try:
            exchanges = load_file(path)
        except CaptureError as exc:
            raise EvaluationError(str(exc)) from None
        if not exchanges:
            raise EvaluationError(f"{path}: $: no exchange in the capture")
        exchange = exchanges[0]
        facts = facts_from_exchange(exchange, classify(exchange))
    if build is not None:
        facts = merge_facts(facts_from_stack(build=build, source="case build"), facts)
    return kind, tuple(expect), facts


def evaluate(cases_dir: Path, entries: Sequence[AtlasEntry]) -> Evaluation:
    """Match every case of `cases_dir` against `entries` (top three each)."""
    if not cases_dir.is_dir():
        raise EvaluationError(f"{cases_dir}: $: not a folder of cases")
    folders = sorted(p for p in cases_dir.iterdir() if (p / "case.yaml").is_file())[:MAX_CASES]
    evaluation = Evaluation()
    for folder in folders:
        kind, expect, facts = load_case_facts(folder)
        matches = match_atlas(facts, entries)
        evaluation.results.append(
            CaseResult(
                case=folder.name,
                kind=kind,
                expect=expect,
                returned=tuple(m.entry.id for m in matches),
                scores=tuple(m.score for m in matches),
            )
        )
    return evaluation


def format_evaluation(evaluation: Evaluation, entries: int) -> str:
    """The table printed by `python -m triage.atlas.evaluate`."""
    lines = [f"{'case':<40} {'expect':<24} top-3 returned (score)"]
    for r in evaluation.results:
        got = ", ".join(
            f"{i} ({round(s, 2):.1f})" for i, s in zip(r.returned, r.scores, strict=True)
        )
        mark = "ok " if (r.hit or (not r.expect and not r.returned)) else "XX "
        lines.append(f"{mark}{r.case:<37} {','.join(r.expect) or '[]':<24} {got or '-'}")
    lines += [
        "",
        f"atlas entries: {entries}; cases: {len(evaluation.results)} "
        f"({len(evaluation.positives)} with an expected entry, "
        f"{len(evaluation.negatives)} with expect: [])",
        f"precision (returned matches that are expected): {evaluation.precision_rate.text()}",
        f"recall (expected entry in the top 3):           {evaluation.recall_rate.text()}",
        f"false alarms (expect: [] cases with a match):   {evaluation.false_alarm_rate.text()}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage.atlas.evaluate", description=__doc__)
    parser.add_argument("cases", nargs="?", type=Path, default=DEFAULT_CASES)
    parser.add_argument(
        "--atlas",
        action="append",
        default=None,
        type=Path,
        metavar="DIR",
        help="read only these atlas folders (default: shipped + team + env)",
    )
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    try:
        entries = load_atlas(args.atlas if args.atlas else atlas_dirs())
        evaluation = evaluate(args.cases, entries)
    except (AtlasError, EvaluationError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"entries": len(entries), **evaluation.to_dict()}, indent=2))
    else:
        print(format_evaluation(evaluation, len(entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
