"""A capture of several exchanges read as a conversation: which exchange is diagnosed, and
which earlier exchanges of the capture are the turns of its conversation.

A prompt-cache incident is seen across requests (a HAR of a chat session, a JSONL log, the
proxy's journal): `triage diagnose` diagnoses one exchange -- the N-th (`--exchange N`, from 1
as `triage capture` counts them), else the last whose reply fails the user-facing checks, else
the last -- and reads the turns before it for the unstable-prefix finding
(triage/checks/prompt_cache_turns.py).

Turns are told apart from other traffic in the same capture (a second conversation, a
web UI's title request) by their structure, never by the prefix being measured:

* chat requests: an earlier request is a turn of a later one when its messages' roles are a
  prefix of the later one's and its last user message is the later one's message at the same
  index (the question it asked is in the later one's history; a retry of the same turn
  counts). The system prompt and the assistant replies may differ: a client re-renders the
  first and may strip reasoning from the second.
* `/completion` requests (`prompt`): consecutive ones to the same URL path.

Bounded: at most MAX_EXCHANGES exchanges in a capture read this way (a clear error names the
file otherwise); the capture itself is bounded by MAX_CAPTURE_BYTES and MAX_JSON_DEPTH.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triage.capture.model import CaptureError, Exchange

__all__ = ["MAX_EXCHANGES", "ConversationCapture", "continues", "read_conversation", "turns_of"]

# A chat session's capture holds tens of turns; a thousand is far above any, and keeps the
# prefix measurements (each turn against the one before) bounded.
MAX_EXCHANGES = 1000


@dataclass(frozen=True)
class ConversationCapture:
    """The exchanges of a capture, the one to diagnose and its conversation's turns."""

    exchanges: tuple[Exchange, ...]
    chosen: int  # position of the diagnosed exchange in `exchanges`
    reason: str  # why that one (shown to the user)
    turns: tuple[int, ...]  # positions of its conversation's turns, oldest first, ending with it

    @property
    def exchange(self) -> Exchange:
        return self.exchanges[self.chosen]

    def label(self, position: int) -> str:
        """How the user finds an exchange in the capture: its number (from 1) and its entry,
        line or record."""
        exchange = self.exchanges[position]
        where = f" ({exchange.location})" if exchange.location else ""
        return f"exchange {position + 1}{where}"


def _messages(request: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    return [m if isinstance(m, dict) else {} for m in messages]


def _last_user(messages: Sequence[Mapping[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def continues(later: Exchange, earlier: Exchange) -> bool:
    """Is `earlier` a turn of the conversation `later` continues (see the module docstring)?"""
    new, old = _messages(later.request), _messages(earlier.request)
    if new is not None and old is not None:
        if not old or len(old) > len(new):
            return False
        if any(a.get("role") != b.get("role") for a, b in zip(old, new, strict=False)):
            return False
        asked = _last_user(old)
        return asked is None or old[asked].get("content") == new[asked].get("content")
    prompts = isinstance(later.request.get("prompt"), str) and isinstance(
        earlier.request.get("prompt"), str
    )
    return prompts and (later.url or "") == (earlier.url or "")


def turns_of(exchanges: Sequence[Exchange], chosen: int) -> tuple[int, ...]:
    """Positions of the turns of the chosen exchange's conversation, oldest first: walking
    back from it, each earlier exchange that the current oldest turn continues."""
    turns = [chosen]
    for position in range(chosen - 1, -1, -1):
        if continues(exchanges[turns[0]], exchanges[position]):
            turns.insert(0, position)
    return tuple(turns)


def _choose(
    exchanges: Sequence[Exchange], pick: int | None, failed: Callable[[Exchange], bool]
) -> tuple[int, str]:
    count = len(exchanges)
    if pick is not None:
        return pick - 1, "chosen with --exchange"
    if count == 1:
        return 0, "the only exchange"
    failing = [i for i, exchange in enumerate(exchanges) if failed(exchange)]
    if failing:
        return failing[-1], "the last exchange whose reply fails"
    return count - 1, "the last exchange (no reply fails the checks)"


def read_conversation(
    exchanges: Sequence[Exchange],
    *,
    file: str,
    pick: int | None = None,
    failed: Callable[[Exchange], bool],
) -> ConversationCapture:
    """The exchange to diagnose (the `pick`-th, from 1; else the last one `failed` says
    fails, else the last) and its conversation's turns in the capture."""
    count = len(exchanges)
    if count == 0:
        raise CaptureError(file, None, "no exchange found")
    if count > MAX_EXCHANGES:
        raise CaptureError(
            file,
            None,
            f"holds {count} exchanges, over the limit of {MAX_EXCHANGES} read as one capture: "
            "cut it to the conversation that failed",
        )
    if pick is not None and not 1 <= pick <= count:
        raise CaptureError(
            file,
            None,
            f"--exchange {pick}: the capture holds {count} exchange"
            + ("s" if count > 1 else "")
            + (f" (1 to {count})" if count > 1 else ""),
        )
    chosen, reason = _choose(exchanges, pick, failed)
    return ConversationCapture(tuple(exchanges), chosen, reason, turns_of(exchanges, chosen))
