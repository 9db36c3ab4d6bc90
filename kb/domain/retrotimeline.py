"""The timeline section of a retrospective (kb.domain.retro): real changes only --
recorded events, captures, cause status moves, revisits and decisions, each citing its
evidence."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from kb.domain.retrotext import (
    REVISIT_ARM,
    _timestamp,
    _when,
    arm_text,
    cite,
    cited,
    code,
    escape,
    evidence_index,
    record_arms,
)
from kb.jsontypes import JsonObject

__all__ = ["TimelineEntry", "timeline_lines"]

TimelineEntry = tuple[datetime, int, int, str]


def timeline_lines(record: JsonObject) -> list[str]:
    """Real changes only: recorded events, captures, status moves, revisits, decisions."""
    index = evidence_index(record)
    recorded = list(record.get("timeline") or [])
    entries: list[TimelineEntry] = []
    for position, entry in enumerate(recorded):
        keys = [str(k) for k in entry.get("evidence") or []]
        text = f"**{_when(entry.get('at'))}**: {cited(entry.get('event'), keys, index)}"
        entries.append((_timestamp(entry.get("at")), 0, position, text))
    _add_captures(entries, record, recorded)
    _add_cause_moves(entries, record, recorded)
    for position, arm in enumerate(record_arms(record)):
        at, key = arm.recorded_at, arm.evidence_id
        if arm.payload.get("arm") != REVISIT_ARM or _represented(recorded, at, [key]):
            continue
        text = f"**{_when(at)}**: {arm_text(arm)} {cite([key])}"
        entries.append((_timestamp(at), 3, position, text))
    for position, decision in enumerate(record.get("decisions") or []):
        kind = str(decision.get("kind"))
        if _represented(recorded, decision.get("at"), [], word=kind):
            continue
        by = f" (by {escape(decision['by'])})" if decision.get("by") else ""
        keys = decision.get("evidence") or []
        when = _when(decision.get("at"))
        text = f"**{when}**: Decision {escape(kind)}{by}. {cite(keys)}"
        if not keys:
            text = f"*{when}: Decision {escape(kind)}{by}, citing no evidence.*"
        entries.append((_timestamp(decision.get("at")), 4, position, text))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    return [f"- {text}" for *_, text in entries] or ["*No timeline is on record.*"]


def _add_captures(
    entries: list[TimelineEntry], record: JsonObject, recorded: list[JsonObject]
) -> None:
    """Captured exchanges per source, one line per stretch between two recorded events
    (exchanges before an incident was opened and after it are not one entry), each with
    the time of its first and last exchange."""
    moments = sorted(_timestamp(entry.get("at")) for entry in recorded)
    by_stretch: dict[tuple[str, int], list[JsonObject]] = {}
    for item in record.get("evidence") or []:
        if item.get("kind") == "exchange":
            at = _timestamp(item.get("recorded_at"))
            stretch = sum(1 for moment in moments if moment <= at)
            source = str(item.get("source") or "a capture")
            by_stretch.setdefault((source, stretch), []).append(item)
    for position, ((source, _), items) in enumerate(by_stretch.items()):
        keys = [str(i.get("id")) for i in items]
        times = sorted(_timestamp(i.get("recorded_at")) for i in items)
        first = min(items, key=lambda i: _timestamp(i.get("recorded_at")))
        if _represented(recorded, first.get("recorded_at"), keys):
            continue
        count = "a failing exchange" if len(items) == 1 else f"{len(items)} exchanges"
        when = _when(first.get("recorded_at"))
        if len(times) > 1 and times[-1] - times[0] >= timedelta(minutes=1):
            when = f"{when} to {_when(times[-1])}"
        text = f"**{when}**: Captured {count} from {code(source)}."
        entries.append((times[0], 1, position, f"{text} {cite(keys)}"))


def _add_cause_moves(
    entries: list[TimelineEntry], record: JsonObject, recorded: list[JsonObject]
) -> None:
    """The causes' status changes, one line per moment and actor. A status recorded again
    (a rerun confirming a confirmed cause) is no change, and a candidate opened with no
    evidence (the engine's catalogue list) is no finding."""
    moments: dict[tuple[datetime, str], list[tuple[str, str, list[str]]]] = {}
    latest: dict[tuple[datetime, str], datetime] = {}
    for cause in record.get("causes") or []:
        for change in cause.get("history") or []:
            keys = [str(k) for k in change.get("evidence") or []]
            if change.get("from") == change.get("to") or (not change.get("from") and not keys):
                continue
            if _represented(recorded, change.get("at"), keys):
                continue
            moved = f"{escape(change.get('from'))} -\\> " if change.get("from") else ""
            minute = _timestamp(change.get("at")).replace(second=0, microsecond=0)
            moment = (minute, str(change.get("actor")))
            moments.setdefault(moment, []).append(
                (code(cause.get("id")), f"{moved}{escape(change.get('to'))}", keys)
            )
            latest[moment] = max(latest.get(moment, minute), _timestamp(change.get("at")))
    for position, ((minute, actor), moves) in enumerate(moments.items()):
        keys = [k for *_, move_keys in moves for k in move_keys]
        # Causes that made the same move are one clause: "`a`, `b` suspected -> rejected".
        by_move: dict[str, list[str]] = {}
        for cause_id, move, _ in moves:
            by_move.setdefault(move, []).append(cause_id)
        ordered = sorted(by_move.items(), key=lambda item: not item[0].endswith("confirmed"))
        clauses = [f"{', '.join(ids)} {move}" for move, ids in ordered]
        text = f"**{_when(minute)}**: {escape(actor)}: {'; '.join(clauses)}."
        moment = (minute, actor)
        entries.append((latest[moment], 2, position, f"{text} {cite(keys)}"))


def _represented(
    recorded: list[JsonObject], at: Any, keys: Sequence[str], word: str | None = None
) -> bool:
    """Whether the recorded timeline already tells of an event that day (same evidence, or
    naming `word`)."""
    day = _timestamp(at).date()
    for entry in recorded:
        if _timestamp(entry.get("at")).date() != day:
            continue
        if word is not None:
            if word.lower() in str(entry.get("event", "")).lower():
                return True
        elif set(keys) & {str(k) for k in entry.get("evidence") or []}:
            return True
    return False
