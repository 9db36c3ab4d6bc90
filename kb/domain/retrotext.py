"""The text helpers of the retrospectives (kb.domain.retro): recorded text as inert Markdown,
evidence citations, which evidence a sentence draws on, and the views of a record's causes,
evidence and probe arms that every section reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timezone
from typing import Any

from kb.domain.retrofix import RecordedArm, p_text
from kb.jsontypes import JsonObject

__all__ = [
    "NO_EVIDENCE",
    "REVISIT_ARM",
    "arm_text",
    "cause_rationale",
    "decisive_keys",
    "evidence_by_id",
    "link_keys",
    "record_arms",
    "failing_text",
    "attribute",
    "cite",
    "cited",
    "code",
    "escape",
    "evidence_anchor",
    "evidence_index",
    "link_ids",
    "sentences",
    "slugify",
]

NO_EVIDENCE = "*(no evidence recorded)*"
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|#!~])")
# An underscore between two letters or digits (`finish_reason`) cannot open or close
# emphasis in CommonMark: it stays as is, so a pasted retro shows no `\_` (issue 28).
_LOOSE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def escape(text: Any) -> str:
    """Recorded text as inert inline Markdown: one line, Markdown punctuation escaped."""
    flat = " ".join(str(text).split())
    return _LOOSE_UNDERSCORE.sub(r"\\_", _MD_SPECIAL.sub(r"\\\1", flat))


def code(text: Any) -> str:
    """Recorded text as an inline code span (inert; backslash escapes do not apply there)."""
    flat = " ".join(str(text).split()).replace("`", "'")
    return f"`{flat}`"


def evidence_anchor(key: str) -> str:
    """The anchor of an evidence entry (GitHub's slug of its heading, the id itself:
    `E6` -> `e6`; short, since a page cites dozens)."""
    return slugify(str(key))


def slugify(text: str) -> str:
    """GitHub-style heading slug; also used for the HTML anchors so links agree."""
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def cite(keys: Iterable[str]) -> str:
    """`[E6, E7]` with each id linked to its appendix entry; a marker when there are none."""
    unique = list(dict.fromkeys(str(k) for k in keys))
    if not unique:
        return NO_EVIDENCE
    links = ", ".join(f"[{escape(k)}](#{evidence_anchor(k)})" for k in unique)
    return f"\\[{links}\\]"


def sentences(text: Any) -> list[str]:
    """Split recorded prose into sentences (so each one can carry its citation)."""
    flat = " ".join(str(text).split())
    return [part for part in _SENTENCE_END.split(flat) if part]


def cited(
    text: Any,
    keys: Sequence[str],
    index: dict[str, str] | None = None,
    fallback: Sequence[str] | None = None,
    *,
    narrow: bool | None = None,
) -> str:
    """Recorded prose with one citation per claim.

    The record links `keys` to the whole statement. A one-sentence statement cites them
    all; in a longer one (or with `narrow=True`) each sentence draws on those of `keys`
    it is attributed to (see `attribute`), else `fallback` (default: all of `keys`), and
    consecutive sentences drawing on the same evidence are one claim with one citation
    at its end (not `[E1]` after every sentence of a rationale).
    """
    parts: list[str] = []
    run: list[str] = []  # consecutive sentences that draw on the same evidence
    run_keys: list[str] | None = None
    split = sentences(text)
    if narrow is None:
        narrow = len(split) > 1
    for sentence in split:
        chosen = attribute(sentence, keys, index or {}) if narrow else []
        chosen = chosen or list(fallback or keys)
        if run and chosen != run_keys:
            parts.append(f"{' '.join(run)} {cite(run_keys or [])}")
            run = []
        run.append(link_ids(escape(sentence), index or {}))
        run_keys = chosen
    if run:
        parts.append(f"{' '.join(run)} {cite(run_keys or [])}")
    return " ".join(parts) or cite(keys)


def link_ids(escaped: str, index: dict[str, str]) -> str:
    """Evidence ids that recorded text itself cites ("... [E5] ...") as links, when the
    record has them; anything else in brackets stays text."""

    def replace(match: re.Match[str]) -> str:
        key = match.group(1).replace("\\", "")
        return cite([key]) if key in index else match.group(0)

    return re.sub(r"\\\[((?:\\.|[A-Za-z0-9.-])+)\\\]", replace, escaped)


_DATE_IN_TEXT = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?")
_WORD = re.compile(r"[a-z][a-z0-9-]{3,}")
_STOPWORDS = frozenset(
    "with that this from were have been when than then they them their there what which "
    "while would could should about after before also only into over same such more most "
    "some other each every both either does done here just like once very first".split()
)


def _numbers(text: str) -> set[str]:
    """Distinctive numbers of a text: two or more digits, dates and years left out."""
    found = set()
    for match in _NUMBER.finditer(_DATE_IN_TEXT.sub(" ", text)):
        number = match.group(0).rstrip("0").rstrip(".") if "." in match.group(0) else match.group(0)
        digits = number.replace(".", "")
        if len(digits) < 2 or ("." not in number and 1900 <= int(number) <= 2100):
            continue
        found.add(number)
    return found


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def evidence_index(record: JsonObject) -> dict[str, str]:
    """Evidence id -> the text a sentence is matched against (summary, source, payload)."""
    index = {}
    for item in record.get("evidence") or []:
        payload = json.dumps(item.get("payload") or {}, ensure_ascii=False, default=str)
        index[str(item.get("id"))] = f"{item.get('summary', '')} {item.get('source', '')} {payload}"
    return index


def attribute(sentence: str, keys: Sequence[str], index: dict[str, str]) -> list[str]:
    """Which of a statement's recorded evidence `keys` a sentence draws on.

    The record links evidence to a whole statement (a cause, a decision), not to each of
    its sentences, so this only narrows within those links, never adds to them: first the
    fewest of them that contain all of the sentence's distinctive numbers (80.8, 2797,
    ...), else those sharing the most content words with it (at least three); [] when
    nothing tells them apart.
    """
    candidates = [k for k in dict.fromkeys(keys) if k in index]
    if not candidates:
        return []
    wanted = _numbers(sentence)
    numbers = {k: _numbers(index[k]) & wanted for k in candidates}
    uncovered = set().union(*numbers.values()) if numbers else set()
    chosen: list[str] = []
    while uncovered:
        best = max(candidates, key=lambda k: len(numbers[k] & uncovered))
        chosen.append(best)
        uncovered -= numbers[best]
    if chosen:
        return [k for k in candidates if k in chosen]
    words = _words(sentence)
    scores = {k: len(_words(index[k]) & words) for k in candidates}
    top = max(scores.values())
    if top < 3:
        return []
    return [k for k in candidates if scores[k] >= max(3, 0.5 * top)]


def _timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=timezone.utc)
    text = str(value or "").strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return datetime.combine(date.fromisoformat(text), time(0), tzinfo=timezone.utc)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    except ValueError:
        return datetime.max.replace(tzinfo=timezone.utc)


def _when(value: Any) -> str:
    """A record timestamp for people: the date, plus the UTC time when there is one."""
    moment = _timestamp(value)
    if moment == datetime.max.replace(tzinfo=timezone.utc):
        return escape(value)
    if (moment.hour, moment.minute, moment.second) == (0, 0, 0):
        return moment.date().isoformat()
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _value(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=False)
    return str(value)


def _key_sort(key: str) -> tuple[str, int, str]:
    match = re.match(r"^([A-Za-z]*)(\d+)(.*)$", key)
    if match:
        return (match.group(1), int(match.group(2)), match.group(3))
    return (key, -1, "")


def failing_text(detection: JsonObject, window_minutes: int | None = None) -> str:
    """The one wording of a live failing count: "10/47 failing (95% CI 13%-35%) in the 10
    min to 2026-12-01 14:48 UTC". Used by the Live page, the retrospective and the
    incident's summary, from the same stored detection."""
    rate = detection.get("rate") or {}
    k, n = rate.get("failures", "?"), rate.get("n", "?")
    text = f"{k}/{n} failing"
    interval = rate.get("interval")
    if isinstance(interval, list) and len(interval) == 2:
        text += f" (95% CI {float(interval[0]):.0%}-{float(interval[1]):.0%})"
    minutes = window_minutes or detection.get("window_minutes")
    as_of = detection.get("as_of")
    if as_of:
        moment = str(as_of)[:16].replace("T", " ")
        text += f" in the {minutes} min to {moment} UTC" if minutes else f" as of {moment} UTC"
    return text


def evidence_by_id(record: JsonObject) -> dict[str, JsonObject]:
    return {str(e.get("id")): e for e in record.get("evidence") or []}


def link_keys(cause: JsonObject, relations: Sequence[str] | None = None) -> list[str]:
    return [
        str(link.get("id"))
        for link in cause.get("evidence") or []
        if relations is None or link.get("relation") in relations
    ]


def decisive_keys(cause: JsonObject) -> list[str]:
    """The evidence a cause's rationale rests on: supports/refutes links, else all links,
    else the evidence of its latest status change that cites any."""
    return (
        link_keys(cause, ("supports", "refutes"))
        or link_keys(cause)
        or next(
            (
                [str(k) for k in change["evidence"]]
                for change in reversed(cause.get("history") or [])
                if change.get("evidence")
            ),
            [],
        )
    )


def cause_rationale(cause: JsonObject) -> str:
    """Why the cause has its status: its rationale, else its latest change's."""
    if cause.get("rationale"):
        return str(cause["rationale"])
    for change in reversed(cause.get("history") or []):
        if change.get("rationale") and change.get("to") == cause.get("status"):
            return str(change["rationale"])
    return f"{cause.get('status')} on the record"


def record_arms(record: JsonObject) -> list[RecordedArm]:
    """The probe-arm measurements among a record's evidence, in record order."""
    arms = []
    for item in record.get("evidence") or []:
        payload = item.get("payload") or {}
        if payload.get("type") == "arm" and payload.get("arm"):
            arms.append(RecordedArm(payload, str(item.get("id")), item.get("recorded_at")))
    return arms


def arm_text(recorded: RecordedArm) -> str:
    arm = recorded.payload
    n, failures = arm.get("n"), arm.get("failures")
    parts = [f"Probe arm {escape(arm.get('arm'))}"]
    if arm.get("variant"):
        parts.append(f" ({escape(arm['variant'])})")
    if isinstance(n, int) and isinstance(failures, int) and n > 0:
        parts.append(f": {failures}/{n} failed ({failures / n:.0%})")
    ci = arm.get("ci95")
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        parts.append(f", 95% interval {ci[0]:.2f}-{ci[1]:.2f}")
    parts.append(p_text(arm))
    if arm.get("decision"):
        parts.append(f", {escape(arm['decision'])}")
    return "".join(parts) + "."


REVISIT_ARM = "revisit"  # kb.repo.decisions.REVISIT_ARM: a re-measurement on a later stack
