"""Built-in check `unstable-prefix`: the turns of a conversation do not share their prompt's
beginning, so llama-server's prompt cache (`cache_prompt`, on by default) reuses nothing and
every turn re-evaluates the whole prompt. The classic cause is a timestamp or a request id
first in the system prompt: one changed character early in the prompt invalidates every
cached token after it.

Two readings, both bounded:

- one exchange (the registered check): a continuation of a conversation (its history holds an
  assistant turn) whose reply's `timings` say the server evaluated a long prompt and took
  almost none of it from the cache (`cache_n` against `prompt_n`; llama-server counts the
  cached tokens in `cache_n` and only the evaluated ones in `prompt_n`). A server restarted
  or serving another conversation in the slot reads the same, so the score is 0.5.
- a sequence of captured exchanges of one conversation (`sequence_findings`): consecutive
  turns whose rendered prompts share less than UNSTABLE_SHARED_SHARE of the earlier turn's
  prompt, reported with the shared prefix in characters, where the first difference is, and
  the reply's `cache_n` when the capture has it.

Measured on the real llama-server b11434 with the gemma4 drill model (-np 1, a 1,400-character
system prompt, five turns): a stable prefix gives cache_n 1820, 1894, 1968, 2042 tokens and
prompt_ms 4.7-5.9 per turn after the first (173.7); a timestamp first in the system prompt
gives cache_n 44 and prompt_ms 146-216 on every turn -- the same as `cache_prompt: false`
(cache_n 0, prompt_ms 120-133).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _dict_or_empty, _pass, _text, check

KIND = "unstable-prefix"
# A prompt shorter than this (tokens / characters) costs little to re-evaluate: not a finding.
MIN_PROMPT_TOKENS = 256
MIN_PROMPT_CHARS = 1000
# The server took less than this share of a continuation's prompt from its cache.
UNSTABLE_CACHED_SHARE = 0.1
# Consecutive turns share less than this share of the earlier turn's rendered prompt.
UNSTABLE_SHARED_SHARE = 0.5
# Bounds: the characters rendered per request and the exchanges read per sequence.
MAX_RENDER_CHARS = 2_000_000
MAX_SEQUENCE = 1000


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cache_off(request: Mapping[str, Any]) -> bool:
    return request.get("cache_prompt") is False


def _continuation(request: Mapping[str, Any]) -> bool:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return False
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)


@check(KIND, number=26, user_facing=False)
def check_unstable_prefix(view: View) -> list[Finding]:
    """A conversation's next turn took (almost) nothing from the server's prompt cache."""
    if _cache_off(view.request):
        return _pass(KIND, "the request turns the prompt cache off (cache_prompt: false)")
    if not _continuation(view.request):
        return _pass(KIND, "not a continuation of a conversation (no assistant turn in it)")
    timings = _dict_or_empty(_dict_or_empty(view.response).get("timings"))
    evaluated, cached = _int(timings.get("prompt_n")), _int(timings.get("cache_n"))
    if evaluated is None or cached is None:
        return _pass(KIND, "the reply carries no timings.prompt_n/cache_n")
    total = evaluated + cached
    if total < MIN_PROMPT_TOKENS or cached >= UNSTABLE_CACHED_SHARE * total:
        return _pass(KIND, f"the server took {cached} of {total} prompt tokens from its cache")
    prompt_ms = timings.get("prompt_ms")
    spent = f" ({prompt_ms:.0f} ms)" if isinstance(prompt_ms, int | float) else ""
    return [
        Finding(
            KIND,
            False,
            0.5,
            f"a continuation of a conversation, and the server took {cached} of its {total} "
            f"prompt tokens from its cache (timings.cache_n) and evaluated {evaluated}{spent}: "
            "the prompt's beginning differs from the turn before (e.g. a timestamp first in "
            "the system prompt), or the slot held another conversation",
            "$.response.timings.cache_n",
        )
    ]


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(_text(_dict_or_empty(part).get("text")) for part in content)
    return _text(content)


@dataclass(frozen=True)
class Piece:
    """One part of a rendered prompt and the JSON path it came from."""

    where: str
    text: str


def rendered_pieces(request: Mapping[str, Any]) -> list[Piece]:
    """The request's prompt in the order a chat template renders it (tools are rendered into
    the system turn, before the messages), one piece per field; `/completion`'s `prompt`."""
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return [Piece("$.request.prompt", prompt)]
    pieces: list[Piece] = []
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        pieces.append(Piece("$.request.tools", json.dumps(tools, sort_keys=True)))
    messages = request.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        message = _dict_or_empty(message)
        pieces.append(Piece(f"$.request.messages[{index}].role", f"<{_text(message.get('role'))}>"))
        where = f"$.request.messages[{index}].content"
        pieces.append(Piece(where, _content_text(message.get("content"))))
        if message.get("tool_calls"):
            text = json.dumps(message["tool_calls"], sort_keys=True, default=str)
            pieces.append(Piece(f"$.request.messages[{index}].tool_calls", text))
    return pieces


def shared_prefix(a: str, b: str) -> int:
    """How many leading characters a and b share (a binary search over slice comparisons:
    O(n log n) in C, not a Python loop per character -- turns run to megabytes)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class TurnStep:
    """One turn against the turn before it."""

    turn: int
    shared_chars: int
    previous_chars: int
    where: str | None  # the field of this turn where the prompts first differ
    offset: int | None  # the character in that field
    cache_n: int | None  # the reply's timings.cache_n, when captured


def _render(request: Mapping[str, Any]) -> tuple[str, list[tuple[int, Piece]]]:
    text, starts, size = [], [], 0
    for piece in rendered_pieces(request):
        if size >= MAX_RENDER_CHARS:
            break
        starts.append((size, piece))
        text.append(piece.text)
        size += len(piece.text)
    return "".join(text)[:MAX_RENDER_CHARS], starts


def turn_steps(exchanges: Sequence[Mapping[str, Any]]) -> list[TurnStep]:
    """Each exchange (a dict with `request` and, optionally, `response`) after the first,
    measured against the one before it; at most MAX_SEQUENCE exchanges are read."""
    steps: list[TurnStep] = []
    previous: str | None = None
    for turn, exchange in enumerate(exchanges[:MAX_SEQUENCE]):
        request = _dict_or_empty(_dict_or_empty(exchange).get("request"))
        prompt, starts = _render(request)
        if previous is not None:
            shared = shared_prefix(previous, prompt)
            where = offset = None
            for start, piece in starts:
                if start <= shared < start + max(len(piece.text), 1):
                    where, offset = piece.where, shared - start
            timings = _dict_or_empty(_dict_or_empty(exchange.get("response")).get("timings"))
            steps.append(
                TurnStep(turn, shared, len(previous), where, offset, _int(timings.get("cache_n")))
            )
        previous = prompt
    return steps


def sequence_findings(exchanges: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """`unstable-prefix` findings for consecutive turns of a conversation whose prompts share
    less than UNSTABLE_SHARED_SHARE of the earlier prompt (which is at least MIN_PROMPT_CHARS
    long); `where` is prefixed with the exchange's index (`$[3].request...`)."""
    findings: list[Finding] = []
    for step in turn_steps(exchanges):
        if step.previous_chars < MIN_PROMPT_CHARS:
            continue
        if step.shared_chars >= UNSTABLE_SHARED_SHARE * step.previous_chars:
            continue
        cached = "" if step.cache_n is None else f"; the reply's timings.cache_n was {step.cache_n}"
        first = (
            f" (first difference at {step.where}, character {step.offset})" if step.where else ""
        )
        findings.append(
            Finding(
                KIND,
                False,
                1.0 - step.shared_chars / step.previous_chars,
                f"turn {step.turn} shares {step.shared_chars} of the {step.previous_chars} "
                f"characters of turn {step.turn - 1}'s prompt{first}: the prompt cache can "
                f"reuse at most that prefix{cached}; move what changes every turn to the end",
                None if step.where is None else f"$[{step.turn}]" + step.where[1:],
                step.offset,
            )
        )
    return findings


CHECKS = (check_unstable_prefix,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
