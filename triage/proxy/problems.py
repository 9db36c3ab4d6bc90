"""The recorder's per-batch decisions: which failing exchanges belong to which live problem,
and when a problem's failure rate opens an incident.

A problem is a model x request shape x primary symptom. For each one in a batch, its failing
exchanges are added to its incident when it has one; otherwise the change detection
(`triage.proxy.rates.detect`: the current window against the trailing one) may open an
incident, or attach the problem to an open or parked incident of the same family. Failures
the client configured (its own max_tokens or stop list) are recorded only, unless the opening
rules say otherwise. Every read and write goes through `kb.service.live.LiveBatch`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from kb.domain.retrotext import failing_text
from kb.jsontypes import JsonObject
from kb.service.live import DetectionFacts, LiveAlarm, LiveBatch, LiveExample, ProblemRef
from triage.atlas.report import incident_references
from triage.proxy.grouping import OpeningRules, group_of, primary_symptom, problem_key
from triage.proxy.prepare import Prepared, _brief
from triage.proxy.rates import detect, signature_kinds
from triage.proxy.record import OpenedIncident

log = logging.getLogger("triage.proxy")


@dataclass(frozen=True)
class ProblemRules:
    """How the writer groups and opens: the windows compared, the opening rules, and the
    replica name recorded as who opened or added what."""

    opening: OpeningRules
    current_window: timedelta
    trailing_window: timedelta
    replica: str


@dataclass(frozen=True)
class Problem:
    """Which exchanges one live problem counts: a model, a request shape, a symptom group."""

    model: str
    shape: str
    group: str


class ProblemWriter:
    """Writes one batch of prepared exchanges and the problems they belong to."""

    def __init__(self, rules: ProblemRules) -> None:
        self.rules = rules
        self.opening = rules.opening
        self.current_window = rules.current_window
        self.trailing_window = rules.trailing_window
        self.replica = rules.replica

    def write(self, batch: LiveBatch, prepared: list[Prepared]) -> list[OpenedIncident]:
        """Insert the batch; then, per problem (model x request shape x primary symptom),
        add its failing exchanges to its incident or run the change detection on it.
        Failures the client configured are recorded only (unless the opening rules say
        otherwise). Returns the incidents opened (slug, model, signature, problem,
        detection, example)."""
        inserted = batch.insert_exchanges([p.row for p in prepared])
        groups: dict[tuple[str, str, str], list[Prepared]] = defaultdict(list)
        for item in prepared:
            row = item.row
            if not row["failed"] or row["key"] not in inserted:
                continue
            if row["client_limit"] and not self.opening.open_on_client_limits:
                continue
            groups[(row["model"], row["shape"], group_of(row["signature"]))].append(item)
        opened = []
        for (model, shape, group), items in sorted(groups.items()):
            items.sort(key=lambda p: p.row["recorded_at"])
            result = self._problem_batch(batch, Problem(model, shape, group), items)
            if result is not None:
                opened.append(result)
        return opened

    def _problem_counts(
        self, batch: LiveBatch, problem: Problem, since: datetime, until: datetime
    ) -> tuple[int, int, dict[str, int]]:
        """(failures of the problem, exchanges of the model x shape, failures by variant)."""
        counts = batch.shape_counts(problem.model, problem.shape, since, until)
        group = problem.group
        variants = {sig: k for sig, k in counts.failures.items() if group_of(sig) == group}
        if self.opening.open_on_client_limits:
            for sig, k in counts.configured.items():
                if group_of(sig) == group:
                    variants[sig] = variants.get(sig, 0) + k
        return sum(variants.values()), counts.n, variants

    def _detection(
        self, batch: LiveBatch, problem: Problem, items: list[Prepared]
    ) -> tuple[DetectionFacts, bool, bool, int, int]:
        """The change detection as of the batch's last exchange: (facts, alarm, enough
        exchanges to open, trailing failures, trailing exchanges)."""
        until = items[-1].row["recorded_at"] + timedelta(microseconds=1)
        since = until - self.current_window
        k, n, variants = self._problem_counts(batch, problem, since, until)
        k0, n0, _ = self._problem_counts(batch, problem, since - self.trailing_window, since)
        detection = detect(k, n, k0, n0)
        facts: DetectionFacts = {
            "failures": detection.failures,
            "n": detection.n,
            "trailing_failures": detection.trailing_failures,
            "trailing_n": detection.trailing_n,
            "p0": detection.p0,
            "p1": detection.p1,
            "llr": detection.llr,
            "upper": detection.upper,
            "lower": detection.lower,
            "verdict": detection.verdict,
            "new": detection.new,
            "rate": {
                "failures": detection.failures,
                "n": detection.n,
                "rate": round(detection.failures / detection.n, 4) if detection.n else 0.0,
                "interval": detection.interval,
            },
            "as_of": items[-1].row["recorded_at"].isoformat(),
            "window_minutes": int(self.current_window.total_seconds() // 60),
            "shape": problem.shape,
            "variants": dict(sorted(variants.items())),
        }
        enough = n + n0 >= self.opening.min_exchanges
        return facts, detection.alarm, enough, k0, n0

    def _problem_batch(
        self, batch: LiveBatch, problem: Problem, items: list[Prepared]
    ) -> OpenedIncident | None:
        model, shape, group = problem.model, problem.shape, problem.group
        facts, alarm, enough, k0, n0 = self._detection(batch, problem, items)
        variants = facts["variants"]
        key = problem_key(group, shape)
        examples = [p.example for p in items if p.example is not None]
        existing = batch.find_problem(model, key)
        if existing is None:  # a row from before problems were recorded
            existing = batch.find_signature(model, items[-1].row["signature"])
        if existing is not None:
            self._add_to_problem(batch, existing, shape, items, examples)
            batch.update_detection(existing, facts)
            return None
        if not alarm or not enough:
            return None
        since = items[-1].row["recorded_at"] + timedelta(microseconds=1) - self.current_window
        first = self._first_example(batch, model, items[0].row["signature"], since, examples, shape)
        upstream = dict(examples[-1]["payload"].get("upstream") or {})
        primary = primary_symptom(signature_kinds(group))
        main = max(variants, key=lambda sig: (variants[sig], sig)) if variants else group
        trailing = int(self.trailing_window.total_seconds() // 60)
        compared = (
            f"trailing {trailing} min {k0}/{n0}"
            if n0
            else f"no exchange of this shape in the trailing {trailing} min to compare with"
        )
        what = "new failure" if facts["new"] else "failure rate rose"
        summary = (
            f"{what}: {primary} ({', '.join(sorted(variants)) or main}) from "
            f"{model or 'unknown model'}, requests shaped {shape}: "
            f"{failing_text(dict(facts))}; {compared}; upstream build "
            f"{upstream.get('build') or '?'}, template "
            f"{(upstream.get('template_sha256') or '?')[:12]}"
        )
        kinds = sorted({kind for p in items for kind in p.kinds})
        ref, outcome = batch.open_or_attach(
            LiveAlarm(
                model=model,
                signature=main,
                kinds=tuple(kinds),
                # No counts in the title: they change, and the title would keep the first ones.
                title=f"Live: {primary} from {model or 'unknown model'} ({shape} requests)",
                summary=summary,
                upstream=upstream,
                detection=facts,
                examples=(*first, *examples),
                opened_by=self.replica,
                shape=shape,
                problem=key,
            )
        )
        if outcome == "existing":  # a replica opened or attached it first
            self._add_to_problem(batch, ref, shape, items, examples)
            return None
        self._add_variants(batch, ref, main, shape, items)
        if outcome == "attached":  # an open or parked incident of the same family
            log.info("%s of %s: evidence added to incident %s", key, model, ref.incident_id)
            return None
        example: JsonObject = examples[-1]["payload"] if examples else {}
        refs = incident_references(example.get("exchange"), kinds, upstream.get("build"))
        batch.add_references(ref.incident_id, refs)  # atlas pointers, shown with the incident
        return {
            "slug": batch.incident_slug(ref.incident_id),
            "model": model,
            "signature": main,
            "problem": key,
            "detection": facts.copy(),
            "example": examples[-1]["payload"] if examples else None,
        }

    def _add_variants(
        self, batch: LiveBatch, ref: ProblemRef, main: str, shape: str, items: list[Prepared]
    ) -> None:
        """Record the batch's symptom variants (signatures other than `main`)."""
        for item in items:
            if item.row["signature"] != main:
                batch.add_variant(
                    ref,
                    signature=item.row["signature"],
                    kinds=item.kinds,
                    shape=shape,
                    by=self.replica,
                )

    def _add_to_problem(
        self,
        batch: LiveBatch,
        ref: ProblemRef,
        shape: str,
        items: list[Prepared],
        examples: list[LiveExample],
    ) -> None:
        """Record the batch's symptom variants and examples on the problem's incident."""
        self._add_variants(batch, ref, ref.signature, shape, items)
        batch.add_examples(ref, examples)

    def _first_example(
        self,
        batch: LiveBatch,
        model: str,
        signature: str,
        since: datetime,
        examples: list[LiveExample],
        shape: str | None = None,
    ) -> list[LiveExample]:
        """The earliest failing exchange of the window (of the problem's request shape, not
        one the client configured), when it came in an earlier batch."""
        first = batch.first_failing(model, signature, since, shape)
        if first is None:
            return []
        key, recorded_at, payload = first
        if payload is None or any(e["payload"].get("live_key") == key for e in examples):
            return []
        return [
            {
                "kind": "exchange",
                "summary": f"live exchange {key[:12]} via proxy: {signature} (first)",
                "payload": payload,
                "source": f"proxy:{self.replica}",
                "recorded_at": recorded_at,
                "brief": _brief(payload, payload.get("exchange", {}).get("status")),
            }
        ]
