"""The `unstable-prefix` finding read from a conversation's captured turns (finding kind 26,
the same kind as the one-exchange check in triage/checks/prefix.py).

`triage diagnose` on a capture of several exchanges (triage/capture/conversation.py) measures
each turn of the diagnosed exchange's conversation against the turn before it: the prompts as
the chat template renders their parts in order (tools, then each message's role and content;
`prompt` for `/completion`), how many leading characters they share, and where they first
differ. A pair "shares no prefix" when it shares less than UNSTABLE_SHARED_SHARE of the
earlier prompt (which is at least MIN_PROMPT_CHARS long: a short prompt costs little to
re-evaluate). Each reply's own `timings` -- `cache_n` (tokens restored from the cache),
`prompt_n` (tokens evaluated) and `prompt_ms` -- are the server's side of the same story and
are quoted as evidence when the capture has them.

The finding fails when some consecutive pair shares no prefix (score: the share of such
pairs), and passes -- still quoting the measurements -- when every pair shares its prefix.
Limit: the parts are compared as the request carries them, not through the model's template
(a template that re-orders or drops parts, or a tokenizer that merges across the point of
difference, moves the boundary by a few tokens, not the reading).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from triage.capture.conversation import ConversationCapture, read_conversation
from triage.capture.model import Exchange
from triage.checks.base import Finding
from triage.checks.prefix import (
    KIND,
    MIN_PROMPT_CHARS,
    UNSTABLE_SHARED_SHARE,
    TurnStep,
    turn_steps,
)

__all__ = [
    "ConversationIntake",
    "ConversationReading",
    "TurnTimings",
    "conversation_finding",
    "conversation_intake",
    "read_turns",
]

MAX_LISTED = 12  # turns quoted one by one in the finding's text (the rest are counted)


@dataclass(frozen=True)
class TurnTimings:
    """A captured reply's prompt timings (None: the reply does not carry them)."""

    cache_n: int | None
    prompt_n: int | None
    prompt_ms: float | None

    def text(self) -> str:
        if self.cache_n is None:
            return "-"
        total = self.cache_n + (self.prompt_n or 0)
        spent = "" if self.prompt_ms is None else f" ({self.prompt_ms:.0f} ms)"
        return f"{self.cache_n}/{total}{spent}"


@dataclass(frozen=True)
class ConversationReading:
    """The turns of the diagnosed exchange's conversation, each pair measured."""

    positions: tuple[int, ...]  # each turn's position in the capture
    labels: tuple[str, ...]  # each turn's place in the capture, as the user finds it
    steps: tuple[TurnStep, ...]  # turn i+1 against turn i
    timings: tuple[TurnTimings, ...]  # each turn's reply

    def unstable(self, step: TurnStep) -> bool:
        return (
            step.previous_chars >= MIN_PROMPT_CHARS
            and step.shared_chars < UNSTABLE_SHARED_SHARE * step.previous_chars
        )

    @property
    def measured(self) -> list[TurnStep]:
        return [s for s in self.steps if s.previous_chars >= MIN_PROMPT_CHARS]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _timings(exchange: Exchange) -> TurnTimings:
    response = exchange.response if isinstance(exchange.response, dict) else {}
    timings = response.get("timings")
    if not isinstance(timings, dict):
        return TurnTimings(None, None, None)
    cached, evaluated = _number(timings.get("cache_n")), _number(timings.get("prompt_n"))
    return TurnTimings(
        None if cached is None else int(cached),
        None if evaluated is None else int(evaluated),
        _number(timings.get("prompt_ms")),
    )


def read_turns(conversation: ConversationCapture) -> ConversationReading:
    """Measure each turn of the conversation against the one before it."""
    turns = [conversation.exchanges[i] for i in conversation.turns]
    steps = turn_steps([{"request": e.request, "response": e.response} for e in turns])
    return ConversationReading(
        conversation.turns,
        tuple(conversation.label(i) for i in conversation.turns),
        tuple(steps),
        tuple(_timings(e) for e in turns),
    )


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _evidence(reading: ConversationReading) -> str:
    if all(t.cache_n is None for t in reading.timings):
        return "the replies carry no timings.cache_n"
    per_turn = [t.text() for t in reading.timings]
    return (
        "the replies' prompt tokens from the cache per turn (timings.cache_n/prompt tokens): "
        + _listed(per_turn)
    )


def conversation_finding(reading: ConversationReading) -> Finding | None:
    """The finding on the conversation's turns; None with fewer than two turns."""
    if not reading.steps:
        return None
    turns = len(reading.labels)
    pairs = [
        f"{s.shared_chars}/{s.previous_chars}" + ("*" if reading.unstable(s) else "")
        for s in reading.steps
    ]
    positions = _listed([str(p + 1) for p in reading.positions])
    head = (
        f"{turns} turns of one conversation in the capture (exchanges {positions}); the "
        f"characters each turn's prompt shares with the turn before's: {_listed(pairs)}"
    )
    measured = reading.measured
    bad = [s for s in measured if reading.unstable(s)]
    if not bad:
        why = (
            "every measured pair shares at least half of the earlier prompt"
            if measured
            else f"no earlier prompt reaches {MIN_PROMPT_CHARS} characters (cheap to re-evaluate)"
        )
        return Finding(KIND, True, 0.0, f"{head}; {why}; {_evidence(reading)}")
    last = bad[-1]
    where = f" at {last.where}, character {last.offset}" if last.where else ""
    return Finding(
        KIND,
        False,
        len(bad) / len(measured),
        f"{head} (*: less than half); {len(bad)} of {len(measured)} consecutive turns share "
        f"no prefix worth caching -- turn {last.turn + 1} ({reading.labels[last.turn]}) first "
        f"differs from the turn before{where}: llama-server's prompt cache reuses at most the "
        f"shared prefix, so every such turn re-evaluates its whole prompt; {_evidence(reading)}; "
        "move what changes every turn (a timestamp, an id) to the end of the prompt",
        last.where,
        last.offset,
    )


@dataclass(frozen=True)
class ConversationIntake:
    """What `triage diagnose` takes from a capture: the exchange it diagnoses, the finding
    on its conversation's turns (None: one turn), and what to tell the user about both."""

    conversation: ConversationCapture
    finding: Finding | None
    notes: tuple[str, ...]

    @property
    def exchange(self) -> Exchange:
        return self.conversation.exchange


def conversation_intake(
    exchanges: Sequence[Exchange],
    *,
    file: str,
    failed: Callable[[Exchange], bool],
    pick: int | None = None,
) -> ConversationIntake:
    """Choose the exchange to diagnose in a capture (see read_conversation; `failed`: does a
    reply fail the user-facing checks, triage.symptoms.is_failure) and read its
    conversation's turns; a capture of one exchange gives that exchange and no finding."""
    conversation = read_conversation(exchanges, file=file, pick=pick, failed=failed)
    if len(exchanges) == 1:
        return ConversationIntake(conversation, None, ())
    reading = read_turns(conversation)
    finding = conversation_finding(reading)
    notes = [
        f"{file}: {len(exchanges)} exchanges; diagnosing "
        f"{conversation.label(conversation.chosen)}: {conversation.reason}",
        f"its conversation in the capture: {len(reading.labels)} turn"
        + ("s" if len(reading.labels) != 1 else ""),
    ]
    if finding is not None:
        verdict = "passed" if finding.passed else "FAILED"
        notes.append(f"{KIND} ({verdict}): {finding.reason}")
    return ConversationIntake(conversation, finding, tuple(notes))
