"""Atlas matches for the places that print them: `triage atlas match`, `triage check`,
`triage diagnose` (before probing and with the verdicts), the proxy's auto-opened incidents
and the UI's incident page. Each match is a pointer under its own heading -- never a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kb.atlas import AtlasEntry, AtlasError, Facts, Match, atlas_dirs, load_atlas, match_atlas
from kb.domain.diagnosis import Finding as FindingRecord
from triage.atlas.facts import (
    facts_from_diagnosis,
    facts_from_exchange,
    facts_from_exchange_dict,
    facts_from_log,
    facts_from_stack,
    failed_kinds,
    merge_facts,
    parse_build,
    stack_facts,
)
from triage.capture import Exchange
from triage.llama.crash import read_log
from triage.stackfile import Stack
from triage.symptoms import Finding

__all__ = [
    "ATLAS_HEADING",
    "atlas_entries",
    "check_lines",
    "check_matches",
    "diagnosis_matches",
    "format_match_dicts",
    "format_matches",
    "incident_references",
    "match_exchange",
    "match_log_text",
    "matches_for_incident",
    "matches_for_record",
    "read_log_file",
    "record_matches",
    "reference_rows",
]

ATLAS_HEADING = "Known public incidents (atlas -- a pointer, not a verdict):"


def atlas_entries(extra: Iterable[str | os.PathLike[str]] = ()) -> tuple[AtlasEntry, ...]:
    """The shipped entries, the team folder, `$TRIAGE_ATLAS_PATH` and `extra` folders;
    raises kb.atlas.AtlasError naming a bad file."""
    return load_atlas(atlas_dirs(extra))


def match_exchange(
    exchange: Exchange,
    findings: Iterable[Finding | Mapping[str, Any]],
    entries: Sequence[AtlasEntry],
    *also: Facts,
) -> list[Match]:
    """The matches of one captured exchange (plus any further facts, e.g. the stack's)."""
    return match_atlas(merge_facts(facts_from_exchange(exchange, findings), *also), entries)


def match_log_text(text: str, entries: Sequence[AtlasEntry]) -> list[Match]:
    """The matches of a llama-server log's text."""
    return match_atlas(facts_from_log(text), entries)


def matches_for_incident(
    exchange: Mapping[str, Any] | None,
    kinds: Iterable[str],
    build: int | None,
    entries: Sequence[AtlasEntry],
) -> list[Match]:
    """The matches of an incident the proxy opened: its example exchange (stored form), its
    finding kinds and the upstream's build when known."""
    facts = facts_from_exchange_dict(exchange or {}, kinds)
    return match_atlas(merge_facts(facts, facts_from_stack(build=build)), entries)


def matches_for_record(record: Mapping[str, Any], entries: Sequence[AtlasEntry]) -> list[Match]:
    """The matches of a stored incident record (UI incident page): its symptoms, its first
    captured exchange (evidence payload `exchange`, as `triage capture` and the proxy store
    it) with that capture's symptoms, and the verdicts of its causes."""
    kinds = [str(s.get("kind")) for s in record.get("symptoms") or [] if isinstance(s, Mapping)]
    exchange: Mapping[str, Any] = {}
    for evidence in record.get("evidence") or []:
        payload = evidence.get("payload") if isinstance(evidence, Mapping) else None
        if not isinstance(payload, Mapping):
            continue
        stored = payload.get("exchange", payload)
        if isinstance(stored, Mapping) and isinstance(stored.get("request"), Mapping):
            exchange = stored
            kinds += [str(kind) for kind in payload.get("symptoms") or []]
            break
    causes = [c for c in record.get("causes") or [] if isinstance(c, Mapping)]
    verdicts = Facts(
        source="diagnosis",
        confirmed_causes=frozenset(
            str(c.get("id")) for c in causes if c.get("status") == "confirmed"
        ),
        rejected_causes=frozenset(
            str(c.get("id")) for c in causes if c.get("status") == "rejected"
        ),
    )
    return match_atlas(merge_facts(facts_from_exchange_dict(exchange, kinds), verdicts), entries)


def format_matches(matches: Sequence[Match], checked: int, *, indent: str = "") -> list[str]:
    """The matches as terminal lines under `ATLAS_HEADING` (or that none matched)."""
    if not matches:
        return [f"{indent}Known public incidents (atlas): no match among {checked} entries"]
    lines = [indent + ATLAS_HEADING]
    for match in matches:
        entry = match.entry
        lines.append(f"{indent}  {entry.id}  score {match.score:.1f}  {entry.title}")
        lines.append(f"{indent}    {entry.source}")
        why = "; ".join(fact.detail for fact in match.facts)
        lines.append(f"{indent}    matched: {why}")
        cause = f"{entry.cause}" + (f" -- {entry.cause_text}" if entry.cause_text else "")
        lines.append(f"{indent}    cause there: {cause}  ({entry.builds.describe()})")
        for advice in match.advice:
            if not advice.startswith("read: "):
                lines.append(f"{indent}    -> {advice}")
    return lines


def reference_rows(matches: Sequence[Match]) -> list[dict[str, str]]:
    """The matches as incident references (url, title, note) for the knowledge base."""
    rows = []
    for match in matches:
        why = "; ".join(fact.detail for fact in match.facts)
        advice = "; ".join(a for a in match.advice if not a.startswith("read: "))
        rows.append(
            {
                "url": match.entry.source,
                "title": f"atlas {match.entry.id}: {match.entry.title}",
                "note": f"atlas match (a pointer, not a verdict), score {match.score:.1f}: "
                f"{why}. {advice}".strip(),
            }
        )
    return rows


def read_log_file(path: Path) -> str:
    """A log's head and tail (bounded) as text; OSError when it cannot be read."""
    if not path.is_file():
        raise OSError(f"{path}: not a file")
    with path.open("rb"):
        pass  # raises PermissionError and the like, with the reason (read_log says "")
    return read_log(path)


def check_matches(
    pairs: Sequence[tuple[Exchange, Sequence[Finding]]],
) -> tuple[list[list[Match]], int, str | None]:
    """`triage check`'s atlas: the matches of each classified exchange, the number of
    entries checked, and a warning instead of an error when the atlas cannot be read (a
    bad team file must not break a CI check)."""
    try:
        entries = atlas_entries()
    except AtlasError as exc:
        return [[] for _ in pairs], 0, f"atlas not read: {exc}"
    return [match_exchange(ex, findings, entries) for ex, findings in pairs], len(entries), None


def check_lines(
    labels: Sequence[str], matches: Sequence[Sequence[Match]], checked: int
) -> list[str]:
    """The lines `triage check` prints: each exchange with matches under its label, or one
    line saying that nothing matched."""
    lines: list[str] = []
    for label, found in zip(labels, matches, strict=True):
        if found:
            lines.append(f"{label}:" if len(labels) > 1 else "")
            lines += format_matches(found, checked, indent="  " if len(labels) > 1 else "")
    if not lines:
        return format_matches([], checked)
    return [line for line in lines if line]


def diagnosis_matches(
    stack: Stack,
    exchange: Mapping[str, Any] | None,
    findings: Sequence[FindingRecord | Mapping[str, Any]],
    diagnosis: Mapping[str, Any] | None = None,
) -> tuple[list[Match], int, str | None]:
    """`triage diagnose`'s atlas: the captured exchange and the stack before probing; with
    the diagnosis, its verdicts and what its servers logged too. (matches, entries checked,
    warning when the atlas cannot be read -- a diagnosis never fails on the atlas)."""
    try:
        entries = atlas_entries()
    except AtlasError as exc:
        return [], 0, f"atlas not read: {exc}"
    parts = [facts_from_exchange_dict(exchange or {}, failed_kinds(findings)), stack_facts(stack)]
    if diagnosis is not None:
        parts.append(facts_from_diagnosis(diagnosis))
    return match_atlas(merge_facts(*parts), entries), len(entries), None


def format_match_dicts(matches: Sequence[Mapping[str, Any]]) -> list[str]:
    """Stored matches (a diagnosis's `atlas_matches`) as terminal lines."""
    if not matches:
        return []
    lines = [ATLAS_HEADING]
    for match in matches:
        lines.append(f"  {match.get('id')}  score {match.get('score')}  {match.get('title')}")
        lines.append(f"    {match.get('source')}")
        why = "; ".join(str(f.get("detail")) for f in match.get("matched") or [])
        lines.append(f"    matched: {why}")
        lines += [
            f"    -> {a}" for a in match.get("advice") or [] if not str(a).startswith("read: ")
        ]
    return lines


def incident_references(
    exchange: Mapping[str, Any] | None, kinds: Iterable[str], build_info: str | None
) -> list[dict[str, str]]:
    """The proxy's hook: an opened incident's atlas matches as references ([] when the atlas
    cannot be read -- recording never fails on the atlas)."""
    try:
        entries = atlas_entries()
    except AtlasError:
        return []
    build = parse_build(build_info or "")
    return reference_rows(matches_for_incident(exchange, kinds, build, entries))


def record_matches(record: Mapping[str, Any]) -> list[Match]:
    """The UI's hook: a stored incident's matches ([] when the atlas cannot be read)."""
    try:
        entries = atlas_entries()
    except AtlasError:
        return []
    return matches_for_record(record, entries)
