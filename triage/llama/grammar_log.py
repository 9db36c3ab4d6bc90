"""llama-server's grammar lines in a running server's log, scanned while it runs and tied to
the replays that were in flight when each was written.

b11434 writes (common/json-schema-to-grammar.cpp, src/llama-grammar.cpp, tools/server):

* `WARNING: JSON schema conversion was incomplete: pattern P is not supported (WHY),
  accepting any string` -- once per request whose schema has a construct the converter
  cannot translate; the request is served with that part unconstrained (fails open);
* `... got exception: {"error": ... JSON schema conversion failed: ...}` -- a schema it
  refuses (an invalid pattern, an unresolved `$ref`): HTTP 400, nothing generated;
* `parse: error parsing grammar: ...`, `failed to parse grammar`, `grammar does not
  contain a 'root' symbol`, `left recursion detected` -- a GBNF grammar it refuses
  ("Failed to initialize samplers"): HTTP 400.

The scan reads the log file incrementally from where it stopped (at most SCAN_CHUNK_BYTES a
call), keeps only matching lines, each cut to LINE_CHARS and redacted (token-shaped secrets
and the server's own secret flag values), at most MAX_LINES of them and MAX_TEXTS distinct
texts; a line longer than PARTIAL_LINE_BYTES is cut. A replay opens a window at the log's
size when its request is sent and closes it when the reply is in. A line belongs to the
replays whose windows hold it and whose request carries the pattern it names (a request
cannot log a pattern it does not carry): to an arm when they are all of that arm, to a
reply when it is the only one. A fail-open line is written once per request; a refused
GBNF grammar writes up to three lines ("error parsing grammar", "failed to parse grammar",
the HTTP error), so those are counted as lines, not requests.
"""

from __future__ import annotations

import bisect
import enum
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from triage.capture.redact import redact_text, redaction_marker

__all__ = [
    "FACT",
    "ArmEvidence",
    "ArmLog",
    "ArmLogFact",
    "GrammarLogFact",
    "LoggedTextFact",
    "GrammarLog",
    "GrammarLogSummary",
    "LineKind",
    "LoggedText",
    "ReplayWindow",
    "classify",
    "arm_evidence",
    "arm_text",
    "request_patterns",
    "summary_fact",
    "unavailable_fact",
]

SCAN_CHUNK_BYTES = 1024 * 1024  # read per scan call (the rest on the next call)
PARTIAL_LINE_BYTES = 64 * 1024  # longer lines are cut (a debug dump of a grammar)
LINE_CHARS = 400  # characters of a matched line kept
MAX_LINES = 2000  # matched lines kept (offset and text); later ones only counted
MAX_TEXTS = 32  # distinct line texts kept; later ones counted as "other"
MAX_WINDOWS = 20_000  # replay windows kept per server; later replays are not attributed
LOOK_BACK_WINDOWS = 512  # windows before a line's offset that may still be open at it
MAX_PATTERNS = 64  # `pattern` strings read from one request (or named by one line)
MAX_PATTERN_CHARS = 1000
MAX_NODES = 10_000  # nodes of a request walked for its patterns
# "pattern P is not supported (WHY), accepting any string", once per pattern in the line.
_NAMED = re.compile(r"pattern (.+?) is not supported \(")


class LineKind(enum.StrEnum):
    """What a grammar line says happened to the request."""

    FAILED_OPEN = "accepting-any-string"  # served, that part of the schema unconstrained
    SCHEMA_REFUSED = "schema-refused"  # HTTP 400: the converter refused the schema
    GRAMMAR_REFUSED = "grammar-refused"  # HTTP 400: the GBNF grammar did not parse


_KINDS: tuple[tuple[re.Pattern[str], LineKind], ...] = (
    (re.compile(r"JSON schema conversion was incomplete"), LineKind.FAILED_OPEN),
    (re.compile(r"JSON schema conversion failed"), LineKind.SCHEMA_REFUSED),
    (
        re.compile(
            r"error parsing grammar|failed to parse grammar|grammar does not contain a '"
            r"|unsupported grammar, left recursion|invalid grammar: "
        ),
        LineKind.GRAMMAR_REFUSED,
    ),
)


def classify(line: str) -> LineKind | None:
    """The kind of a log line, None when it is no grammar line."""
    for pattern, kind in _KINDS:
        if pattern.search(line):
            return kind
    return None


def request_patterns(body: object) -> frozenset[str]:
    """Every `pattern` string in a request (its schemas, tools' parameters), bounded."""
    found: set[str] = set()
    stack: list[object] = [body]
    seen = 0
    while stack and seen < MAX_NODES and len(found) < MAX_PATTERNS:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and len(pattern) <= MAX_PATTERN_CHARS:
                found.add(pattern)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(found)


@dataclass(frozen=True)
class _Line:
    offset: int
    kind: LineKind
    text: int  # index into GrammarLog.texts (-1: past MAX_TEXTS)
    patterns: frozenset[str] = frozenset()  # the patterns a fail-open line names


@dataclass
class ReplayWindow:
    """One replay on the server: the log's size when its request was sent and when its
    reply was in."""

    arm: str
    index: int
    start: int
    end: int | None = None  # None while the reply is awaited
    shared: bool = False  # another replay was in flight on this server meanwhile
    patterns: frozenset[str] = frozenset()  # every `pattern` string its request carries


@dataclass(frozen=True)
class LoggedText:
    """One distinct grammar line and how often the log holds it."""

    kind: LineKind
    text: str
    count: int


@dataclass(frozen=True)
class ArmLog:
    """One arm's replays on this server and the grammar lines written while they ran.

    `lines`: lines written while only this arm's replays were in flight (of the kinds
    written once per request: one per request); `replies_alone`: replays that were alone
    on the server, so whatever the log holds in their window is theirs; `replies_logged`:
    those of them with a grammar line."""

    arm: str
    replies: int
    lines: dict[LineKind, int]
    replies_alone: int
    replies_logged: dict[LineKind, int]


@dataclass(frozen=True)
class GrammarLogSummary:
    """What the log of one server said about grammars during a run."""

    texts: tuple[LoggedText, ...]
    arms: tuple[ArmLog, ...]
    outside: int  # lines written while no replay was in flight (observation requests)
    shared: int  # lines written while several arms' replays were in flight
    not_scanned: str  # why part of the log was not scanned ("" when all of it was)

    def arm(self, name: str) -> ArmLog | None:
        return next((a for a in self.arms if a.arm == name), None)


@dataclass
class GrammarLog:
    """The grammar lines of one server's log file, scanned while the server runs."""

    path: Path
    secrets: Sequence[str] = ()
    limit_bytes: int | None = None  # the launcher's file limit: past it nothing is scanned
    texts: list[LoggedText] = field(default_factory=list)
    _lines: list[_Line] = field(default_factory=list)
    _windows: list[ReplayWindow] = field(default_factory=list)
    _open: list[ReplayWindow] = field(default_factory=list)
    _offset: int = 0  # bytes of the file read so far
    _partial: bytes = b""  # the last line read, not complete yet
    _skip: bool = False  # the rest of a line cut at PARTIAL_LINE_BYTES is still to come
    _dropped_lines: int = 0
    _dropped_windows: int = 0
    _other: int = 0
    _error: str = ""

    # -- replays -----------------------------------------------------------------------------
    def open_window(
        self, arm: str, index: int, patterns: frozenset[str] = frozenset()
    ) -> ReplayWindow | None:
        """A replay's request (carrying `patterns`, see request_patterns) is about to be
        sent: its window starts at the log's size."""
        if len(self._windows) >= MAX_WINDOWS:
            self._dropped_windows += 1
            return None
        window = ReplayWindow(arm, index, self._size(), shared=bool(self._open), patterns=patterns)
        for other in self._open:
            other.shared = True
        self._open.append(window)
        self._windows.append(window)
        return window

    def close_window(self, window: ReplayWindow | None) -> None:
        """Its reply is in: the window ends at the log's size now; the new lines are read."""
        if window is None:
            return
        window.end = self._size()
        if window in self._open:
            self._open.remove(window)
        self.scan()

    # -- reading -----------------------------------------------------------------------------
    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return self._offset

    def scan(self, limit: int = SCAN_CHUNK_BYTES) -> bool:
        """Read what the log gained since the last call (at most `limit` bytes); False when
        there was nothing new."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(limit)
        except OSError as exc:
            self._error = f"the log could not be read ({exc.strerror or exc})"
            return False
        if not data:
            return False
        base = self._offset - len(self._partial)  # file offset of buffer[0]
        self._offset += len(data)
        buffer = self._partial + data
        position = 0
        while (newline := buffer.find(b"\n", position)) != -1:
            if self._skip:
                self._skip = False
            else:
                self._take(buffer[position:newline], base + position)
            position = newline + 1
        rest = buffer[position:]
        if len(rest) > PARTIAL_LINE_BYTES:
            if not self._skip:
                self._take(rest[:PARTIAL_LINE_BYTES], base + position)
            rest, self._skip = b"", True
        self._partial = rest
        return True

    def scan_all(self, chunks: int = 64) -> None:
        """Read the rest of the log (bounded: at most `chunks` scan calls)."""
        for _ in range(chunks):
            if not self.scan():
                return

    def _take(self, raw: bytes, offset: int) -> None:
        line = raw.decode("utf-8", errors="replace").strip()
        kind = classify(line)
        if kind is None:
            return
        if len(self._lines) >= MAX_LINES:
            self._dropped_lines += 1
            return
        named = (
            frozenset(_NAMED.findall(line)[:MAX_PATTERNS]) if kind is LineKind.FAILED_OPEN else None
        )
        text = self._text_index(kind, self._clean(line))
        self._lines.append(_Line(offset, kind, text, named or frozenset()))

    def _clean(self, line: str) -> str:
        text = redact_text(line[:LINE_CHARS])
        for secret in self.secrets:
            text = text.replace(secret, redaction_marker(secret))
        return text

    def _text_index(self, kind: LineKind, text: str) -> int:
        for i, known in enumerate(self.texts):
            if known.kind is kind and known.text == text:
                self.texts[i] = LoggedText(kind, text, known.count + 1)
                return i
        if len(self.texts) >= MAX_TEXTS:
            self._other += 1
            return -1
        self.texts.append(LoggedText(kind, text, 1))
        return len(self.texts) - 1

    # -- what it showed ----------------------------------------------------------------------
    def summary(self) -> GrammarLogSummary:
        """The lines per arm and per reply. A line belongs to the replays in flight when it
        was written (their windows hold its offset) that carry the pattern it names (a
        request cannot log a pattern it does not carry): to an arm when they are all of
        that arm, to a reply when it is the only one."""
        windows = self._windows
        starts = [w.start for w in windows]
        per_arm: dict[str, dict[LineKind, int]] = {w.arm: {} for w in windows}
        tied: dict[int, set[LineKind]] = {}  # id(window) -> kinds of the lines tied to it
        outside = shared = 0
        for line in self._lines:
            last = bisect.bisect_right(starts, line.offset)
            inside = [
                w
                for w in windows[max(0, last - LOOK_BACK_WINDOWS) : last]
                if line.offset < _end(w) and (not line.patterns or bool(w.patterns & line.patterns))
            ]
            owners = {w.arm for w in inside}
            if not inside:
                outside += 1
                continue
            if len(owners) > 1:
                shared += 1
                continue
            counts = per_arm[inside[0].arm]
            counts[line.kind] = counts.get(line.kind, 0) + 1
            if len(inside) == 1:
                tied.setdefault(id(inside[0]), set()).add(line.kind)
        arms: list[ArmLog] = []
        for arm, counts in per_arm.items():
            mine = [w for w in windows if w.arm == arm]
            replies_logged: dict[LineKind, int] = {}
            for window in mine:
                for kind in tied.get(id(window), ()):
                    replies_logged[kind] = replies_logged.get(kind, 0) + 1
            alone = sum(not w.shared for w in mine)
            arms.append(ArmLog(arm, len(mine), counts, alone, replies_logged))
        texts = tuple(self.texts)
        return GrammarLogSummary(texts, tuple(arms), outside, shared, self._not_scanned())

    def _not_scanned(self) -> str:
        notes = []
        if self._error:
            notes.append(self._error)
        if self.limit_bytes is not None and self._offset >= self.limit_bytes:
            notes.append(
                f"the log reached its {self.limit_bytes}-byte limit: later lines were not scanned"
            )
        if self._dropped_lines:
            notes.append(f"{self._dropped_lines} grammar lines past the first {MAX_LINES}")
        if self._dropped_windows:
            notes.append(f"{self._dropped_windows} replays past the first {MAX_WINDOWS}")
        if self._other:
            notes.append(f"{self._other} lines of other texts past {MAX_TEXTS}")
        return "; ".join(notes)


def _end(window: ReplayWindow) -> int:
    return window.end if window.end is not None else 1 << 62


# -- the observation ---------------------------------------------------------------------------
FACT = "server-log-grammar"  # the incident's server; other servers: "<arms>-server-log-grammar"
_SAYS = {
    LineKind.FAILED_OPEN: "accepting any string (the grammar fails open)",
    LineKind.SCHEMA_REFUSED: "the schema refused (HTTP 400)",
    LineKind.GRAMMAR_REFUSED: "the grammar refused (HTTP 400)",
}


class LoggedTextFact(TypedDict):
    """One distinct line in the observation."""

    kind: str
    text: str
    count: int


class ArmLogFact(TypedDict):
    """One arm's share of the lines in the observation (see ArmLog)."""

    replies: int
    lines: dict[str, int]
    replies_alone: int
    replies_logged: dict[str, int]


class GrammarLogFact(TypedDict, total=False):
    """The observation `server-log-grammar` as stored (`available` False: a URL server)."""

    name: str
    available: bool
    server: str
    lines: list[LoggedTextFact]
    arms: dict[str, ArmLogFact]
    outside_replays: int
    several_arms_in_flight: int
    not_scanned: str
    summary: str


def unavailable_fact(name: str, why: str) -> GrammarLogFact:
    """The observation of a server whose log the engine cannot read (given by URL)."""
    return {
        "name": name,
        "available": False,
        "summary": f"server log: not available ({why}): no grammar line can be shown",
    }


def summary_fact(name: str, server: str, summary: GrammarLogSummary) -> GrammarLogFact:
    """The observation of one server's log (JSON-ready, for the evidence and the rules)."""
    return {
        "name": name,
        "available": True,
        "server": server,
        "lines": [{"kind": t.kind.value, "text": t.text, "count": t.count} for t in summary.texts],
        "arms": {
            a.arm: {
                "replies": a.replies,
                "lines": {k.value: v for k, v in a.lines.items()},
                "replies_alone": a.replies_alone,
                "replies_logged": {k.value: v for k, v in a.replies_logged.items()},
            }
            for a in summary.arms
        },
        "outside_replays": summary.outside,
        "several_arms_in_flight": summary.shared,
        "not_scanned": summary.not_scanned,
        "summary": _summary_text(server, summary),
    }


def _summary_text(server: str, summary: GrammarLogSummary) -> str:
    replies = sum(a.replies for a in summary.arms)
    if not summary.texts:
        text = (
            f"server log of {server}: no grammar warning or error while {replies} replays ran "
            "(no 'JSON schema conversion was incomplete', 'failed to parse grammar')"
        )
    else:
        first = summary.texts[0]
        text = f'server log of {server}: "{first.text}" ({first.count}x)'
        if len(summary.texts) > 1:
            text += f" and {len(summary.texts) - 1} other grammar lines"
        text += "; " + "; ".join(arm_text(a) for a in summary.arms)
    if summary.not_scanned:
        text += f" ({summary.not_scanned})"
    return text


def arm_text(arm: ArmLog, kind: LineKind = LineKind.FAILED_OPEN) -> str:
    """One arm's share of the lines of `kind`, e.g. "baseline: 8 lines 'accepting any
    string' (the grammar fails open) for 8 replays, 8 tied to one reply each"."""
    lines = arm.lines.get(kind, 0)
    text = f"{arm.arm}: {lines} {'line' if lines == 1 else 'lines'} {_SAYS[kind]} for "
    text += f"{arm.replies} {'replay' if arm.replies == 1 else 'replays'}"
    tied = arm.replies_logged.get(kind, 0)
    if tied:
        text += f", {tied} tied to one reply each"
    elif not lines and arm.replies_alone:
        text += f" ({arm.replies_alone} of them alone on the server)"
    return text


@dataclass(frozen=True)
class ArmEvidence:
    """What the incident's server log said while one arm replayed (read back from the fact)."""

    available: bool
    replies: int = 0
    failed_open: int = 0  # lines "accepting any string" while only this arm was in flight
    refused: int = 0  # schema / grammar refusal lines
    text: str = ""  # the first such line's text
    sentence: str = ""  # arm_text's wording, "" when unavailable


def arm_evidence(facts: Mapping[str, Mapping[str, object]], arm: str) -> ArmEvidence | None:
    """The incident's server log for `arm` (None: no such observation in this run)."""
    fact = facts.get(FACT)
    if not isinstance(fact, dict):
        return None
    if not fact.get("available"):
        return ArmEvidence(False, sentence=str(fact.get("summary") or ""))
    arms = fact.get("arms")
    entry = arms.get(arm) if isinstance(arms, dict) else None
    if not isinstance(entry, dict):
        return ArmEvidence(True, sentence=f"{arm}: no replay on this server's log")
    lines = entry.get("lines") if isinstance(entry.get("lines"), dict) else {}
    logged = entry.get("replies_logged") if isinstance(entry.get("replies_logged"), dict) else {}
    assert isinstance(lines, dict) and isinstance(logged, dict)
    parsed = ArmLog(
        arm,
        int(entry.get("replies") or 0),
        {LineKind(k): int(v) for k, v in lines.items() if k in _VALUES},
        int(entry.get("replies_alone") or 0),
        {LineKind(k): int(v) for k, v in logged.items() if k in _VALUES},
    )
    texts = fact.get("lines") if isinstance(fact.get("lines"), list) else []
    assert isinstance(texts, list)
    first = next(
        (str(t.get("text")) for t in texts if isinstance(t, dict) and t.get("kind") == _OPEN),
        next((str(t.get("text")) for t in texts if isinstance(t, dict)), ""),
    )
    refused = parsed.lines.get(LineKind.SCHEMA_REFUSED, 0)
    refused += parsed.lines.get(LineKind.GRAMMAR_REFUSED, 0)
    return ArmEvidence(
        True,
        parsed.replies,
        parsed.lines.get(LineKind.FAILED_OPEN, 0),
        refused,
        first,
        arm_text(parsed),
    )


_VALUES = frozenset(k.value for k in LineKind)
_OPEN = LineKind.FAILED_OPEN.value
