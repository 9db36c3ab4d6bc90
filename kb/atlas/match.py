"""Matching facts about a failure against the atlas: a score, the facts that matched, and
what to do. Pure: facts in, matches out.

The facts come from a capture, a server log or a diagnosis (triage/atlas/facts.py reads
them); here they are plain values. Each atlas entry is scored by the weighted facts it
shares with them:

- a signature string (an error string or a log string of the entry) found in the texts is
  the strong fact; its weight is shared among the entries that list the same string, and a
  short string weighs less than a long one (short strings match by accident);
- a finding kind, an HTTP status, a backend are weak: on their own they never match;
- a model family, a CPU flag, a server flag, a client add context; a model of another
  family the atlas knows, or a CPU flag set read in full without the entry's flag,
  subtracts (a model alias no family matches, "gpt-4" or "local", is no evidence);
- the build: inside the affected range adds, outside subtracts, at or past `fixed_in`
  subtracts more and the match says "you are past the fix";
- a measured verdict (from a diagnosis): the entry's cause confirmed adds, rejected
  subtracts. The atlas never changes a verdict; the verdict only moves the pointer.

An entry matches only with a signature string, or with a finding kind plus at least two
context facts, and a score of at least `THRESHOLD`. No match is better than a wrong one:
the weights are fixed (see the README section "Atlas" for how they were chosen and what
they measure on the held-out cases).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kb.atlas.loader import AtlasEntry
from kb.jsontypes import JsonObject

__all__ = [
    "THRESHOLD",
    "TOP",
    "WEIGHTS",
    "Facts",
    "Match",
    "MatchedFact",
    "family_in",
    "match_atlas",
    "normalise_text",
    "score_entry",
]

# Fixed on the atlas-code fixture cases (tests/fixtures/atlas) before the held-out cases
# were measured; not tuned to them.
WEIGHTS: dict[str, float] = {
    "string_long": 3.0,  # a signature string of at least LONG_STRING characters
    "string_short": 1.5,
    "strings_cap": 6.0,  # at most this much from strings, however many matched
    "finding_kind": 0.75,  # the first kind in common; each further one adds a third of it
    "http_status": 0.5,
    "model": 1.0,
    "model_mismatch": -1.0,
    "cpu_flag": 1.5,
    "cpu_flag_missing": -1.5,
    "server_flag": 1.0,
    "backend": 0.25,
    "client": 0.75,
    "build_in_range": 0.75,
    "build_out_of_range": -1.0,
    "build_past_fix": -1.5,
    "cause_confirmed": 1.5,
    "cause_rejected": -2.0,
}
THRESHOLD = 3.0
LONG_STRING = 16
# Without a signature string: a finding kind and at least this many context facts.
MIN_CONTEXT_FACTS = 2
TOP = 3
MAX_TEXT_CHARS = 2 * 1024 * 1024
_SPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """Lower case, runs of white space as one space (signatures span wrapped lines)."""
    return _SPACE.sub(" ", text[:MAX_TEXT_CHARS].casefold())


@dataclass(frozen=True)
class Facts:
    """What is known about one failure. Empty / None means unknown (never "absent"), except
    `cpu_flags` when `cpu_flags_known` says the whole set was read (e.g. system_info)."""

    source: str  # capture | log | diagnosis
    texts: tuple[str, ...] = ()  # error bodies, reply text, log text: searched for signatures
    finding_kinds: frozenset[str] = frozenset()
    http_status: frozenset[int] = frozenset()
    build: int | None = None
    models: tuple[str, ...] = ()  # model names, file names, architectures as seen
    backends: frozenset[str] = frozenset()
    cpu_flags: frozenset[str] = frozenset()
    cpu_flags_known: bool = False
    server_flags: frozenset[str] = frozenset()
    clients: frozenset[str] = frozenset()
    confirmed_causes: frozenset[str] = frozenset()
    rejected_causes: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()  # what was read, for display (build source, backtrace symbol)

    def searchable(self) -> str:
        return normalise_text("\n".join(self.texts))


@dataclass(frozen=True)
class MatchedFact:
    """One fact that moved an entry's score, and by how much."""

    kind: str  # string | finding_kind | http_status | model | cpu_flag | build | cause ...
    detail: str
    weight: float

    def to_dict(self) -> JsonObject:
        return {"kind": self.kind, "detail": self.detail, "weight": round(self.weight, 2)}


@dataclass(frozen=True)
class Match:
    """An atlas entry that matched: its score, the facts behind it, and what to do."""

    entry: AtlasEntry
    score: float
    facts: tuple[MatchedFact, ...]
    advice: tuple[str, ...]
    past_fix: bool = False
    build: int | None = None

    def to_dict(self) -> JsonObject:
        """The JSON form (`triage atlas match --json`, diagnosis `atlas_matches`)."""
        return {
            "id": self.entry.id,
            "title": self.entry.title,
            "source": self.entry.source,
            "cause": self.entry.cause,
            "score": round(self.score, 2),
            "matched": [fact.to_dict() for fact in self.facts],
            "builds": self.entry.builds.describe(),
            "past_fix": self.past_fix,
            "advice": list(self.advice),
        }


@lru_cache(maxsize=256)
def _family_pattern(family: str) -> re.Pattern[str]:
    """`gemma-4` matches gemma-4-31b, Gemma4, gemma_4 but not gemma-40; `qwen3` matches
    Qwen3-30B-A3B and the architecture qwen3moe but not qwen3.5."""
    parts = [re.escape(p) for p in re.split(r"[-_ .]+", family.casefold()) if p]
    body = r"[-_ ]?".join(parts)
    return re.compile(rf"(?<![a-z0-9]){body}(?![0-9]|\.[0-9])")


def family_in(family: str, names: Iterable[str]) -> bool:
    """Whether a model family appears in any of these model names."""
    pattern = _family_pattern(family)
    return any(pattern.search(name.casefold()) for name in names)


def _flag_name(flag: str) -> str:
    return flag.split()[0].split("=")[0]


def _string_frequency(entries: Sequence[AtlasEntry]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for entry in entries:
        strings = {
            normalise_text(s).strip()
            for s in (*entry.signatures.error_strings, *entry.signatures.log_strings)
        }
        counts.update(strings)
    return counts


def _string_facts(
    entry: AtlasEntry, text: str, frequency: Counter[str]
) -> tuple[list[MatchedFact], float]:
    facts: list[MatchedFact] = []
    total = 0.0
    seen: set[str] = set()
    for raw in (*entry.signatures.error_strings, *entry.signatures.log_strings):
        needle = normalise_text(raw).strip()
        if not needle or needle in seen or needle not in text:
            continue
        seen.add(needle)
        base = WEIGHTS["string_long"] if len(needle) >= LONG_STRING else WEIGHTS["string_short"]
        weight = base / max(1, frequency[needle])
        shared = f" (shared by {frequency[needle]} entries)" if frequency[needle] > 1 else ""
        facts.append(MatchedFact("string", f"{raw!r} found{shared}", weight))
        total += weight
    return facts, min(total, WEIGHTS["strings_cap"])


def _build_fact(entry: AtlasEntry, build: int | None) -> tuple[MatchedFact | None, bool]:
    """The build's fact (None when unknown on either side) and whether it is past the fix."""
    builds = entry.builds
    if build is None:
        return None, False
    if builds.fixed_in is not None and build >= builds.fixed_in:
        return (
            MatchedFact(
                "build",
                f"b{build} is at or past the fix (b{builds.fixed_in})",
                WEIGHTS["build_past_fix"],
            ),
            True,
        )
    low, high = builds.affected_from, builds.affected_to
    if low is None and high is None:
        if builds.fixed_in is not None:  # only the fix is known: before it is consistent
            return MatchedFact(
                "build",
                f"b{build} is before the fix (b{builds.fixed_in})",
                WEIGHTS["build_in_range"],
            ), False
        return None, False
    if (low is None or build >= low) and (high is None or build <= high):
        return MatchedFact(
            "build", f"b{build} is inside {builds.describe()}", WEIGHTS["build_in_range"]
        ), False
    return MatchedFact(
        "build", f"b{build} is outside {builds.describe()}", WEIGHTS["build_out_of_range"]
    ), False


def _context_facts(entry: AtlasEntry, facts: Facts, models_recognised: bool) -> list[MatchedFact]:
    found: list[MatchedFact] = []
    if entry.models and facts.models:
        families = [f for f in entry.models if family_in(f, facts.models)]
        if families:
            found.append(MatchedFact("model", f"model family {families[0]}", WEIGHTS["model"]))
        elif models_recognised:
            # Only a name of another family the atlas knows contradicts the entry: clients
            # send any alias ("gpt-4", "local") and llama-server ignores it.
            seen = ", ".join(facts.models[:2])
            found.append(
                MatchedFact(
                    "model",
                    f"model {seen} is none of {', '.join(entry.models)}",
                    WEIGHTS["model_mismatch"],
                )
            )
    if entry.cpu_flags:
        wanted = {flag.casefold() for flag in entry.cpu_flags}
        present = sorted(wanted & facts.cpu_flags)
        if present:
            found.append(
                MatchedFact("cpu_flag", f"CPU flag {', '.join(present)}", WEIGHTS["cpu_flag"])
            )
        elif facts.cpu_flags_known:
            found.append(
                MatchedFact(
                    "cpu_flag",
                    f"CPU has none of {', '.join(sorted(wanted))}",
                    WEIGHTS["cpu_flag_missing"],
                )
            )
    flags = sorted({_flag_name(f) for f in entry.server_flags} & facts.server_flags)
    if flags:
        found.append(
            MatchedFact("server_flag", f"server flag {', '.join(flags)}", WEIGHTS["server_flag"])
        )
    clients = sorted({c.casefold() for c in entry.clients} & facts.clients)
    if clients:
        found.append(MatchedFact("client", f"client {', '.join(clients)}", WEIGHTS["client"]))
    if entry.cause in facts.confirmed_causes:
        found.append(
            MatchedFact(
                "cause",
                f"cause {entry.cause} confirmed by the diagnosis",
                WEIGHTS["cause_confirmed"],
            )
        )
    elif entry.cause in facts.rejected_causes:
        found.append(
            MatchedFact(
                "cause", f"cause {entry.cause} rejected by the diagnosis", WEIGHTS["cause_rejected"]
            )
        )
    return found


def _weak_facts(entry: AtlasEntry, facts: Facts) -> list[MatchedFact]:
    found: list[MatchedFact] = []
    kinds = sorted(set(entry.signatures.finding_kinds) & facts.finding_kinds)
    if kinds:
        weight = WEIGHTS["finding_kind"] * (1 + (len(kinds) - 1) / 3)
        found.append(MatchedFact("finding_kind", f"finding {', '.join(kinds)}", weight))
    statuses = sorted(set(entry.signatures.http_status) & facts.http_status)
    if statuses:
        found.append(MatchedFact("http_status", f"HTTP {statuses[0]}", WEIGHTS["http_status"]))
    backends = sorted(set(entry.backends) & facts.backends)
    if backends:
        found.append(MatchedFact("backend", f"backend {backends[0]}", WEIGHTS["backend"]))
    return found


def _advice(entry: AtlasEntry, past_fix: bool, build: int | None) -> tuple[str, ...]:
    advice: list[str] = []
    fixed = entry.builds.fixed_in
    if past_fix and fixed is not None:
        advice.append(
            f"you are past the fix (b{build} >= b{fixed}): if this is the same failure it is a "
            "regression or a different bug -- compare with the report before acting on it"
        )
    elif fixed is not None:
        advice.append(f"upgrade llama.cpp to b{fixed} or later")
    if entry.fix:
        advice.append(f"fix: {entry.fix}")
    if entry.workaround:
        advice.append(f"workaround: {entry.workaround}")
    advice.append(f"read: {entry.source}")
    return tuple(advice)


def score_entry(
    entry: AtlasEntry,
    facts: Facts,
    text: str,
    frequency: Counter[str],
    models_recognised: bool = True,
) -> Match | None:
    """The entry's match, or None when it does not pass the gate and threshold.
    `models_recognised`: the facts' model names belong to a family the atlas knows."""
    strings, string_score = _string_facts(entry, text, frequency)
    weak = _weak_facts(entry, facts)
    context = _context_facts(entry, facts, models_recognised)
    build_fact, past_fix = _build_fact(entry, facts.build)
    positive_context = [f for f in context if f.weight > 0]
    kind_matched = any(f.kind == "finding_kind" for f in weak)
    if not strings and not (kind_matched and len(positive_context) >= MIN_CONTEXT_FACTS):
        return None
    moved = [*strings, *weak, *context, *([build_fact] if build_fact else [])]
    score = string_score + sum(f.weight for f in moved if f.kind != "string")
    if score < THRESHOLD:
        return None
    return Match(
        entry=entry,
        score=score,
        facts=tuple(moved),
        advice=_advice(entry, past_fix, facts.build),
        past_fix=past_fix,
        build=facts.build,
    )


def match_atlas(facts: Facts, entries: Sequence[AtlasEntry], top: int | None = TOP) -> list[Match]:
    """The entries that match these facts, best first (at most `top`; None: all)."""
    text = facts.searchable()
    frequency = _string_frequency(entries)
    families = {family for entry in entries for family in entry.models}
    recognised = any(family_in(family, facts.models) for family in families)
    matches = [
        m for e in entries if (m := score_entry(e, facts, text, frequency, recognised)) is not None
    ]
    matches.sort(key=lambda m: (-m.score, m.entry.id))
    return matches if top is None else matches[:top]
