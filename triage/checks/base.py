"""What every symptom check shares: the `Finding` it returns, the `View` of an exchange it
reads, the `Check` protocol the catalogue holds, and the thresholds of the built-in checks.

A check is any object with `id` (its finding kind), a stable `number` (kb/vocab.py for the
built-ins, 32 and up for a plugin's), `user_facing` (whether a failed finding means the
user saw a broken reply) and `run(view) -> list[Finding]`. The `check` decorator turns a
function into one. Built-in checks live in triage/checks/{content,tools,transport}.py and
are registered through the `triage.plugins` entry points like any plugin's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from kb.domain.diagnosis import Finding as FindingRecord
from kb.jsontypes import JsonObject
from triage.capture import Exchange

__all__ = [
    "Check",
    "Choice",
    "Finding",
    "FunctionCheck",
    "View",
    "check",
    "view",
]

# --- thresholds -----------------------------------------------------------------------

# finish_reason values that mean "the token limit stopped generation" (OpenAI/llama.cpp
# say "length"; Anthropic-style proxies say "max_tokens").
LENGTH_FINISH_REASONS = frozenset({"length", "max_tokens"})
# Visible output (content plus tool-call arguments) this short after a length stop is not
# an answer: a sentence fragment at most. The seed incident's failures had 0 characters.
SHORT_CONTENT_CHARS = 40
# "Reasoning holds most of the completion tokens": a strict majority.
REASONING_MAJORITY_SHARE = 0.5
# A longer answer still counts as cut short when the thought took four fifths of what was
# generated: the answer got at most a fifth of the budget, so switching thinking off (not
# raising max_tokens) is what would have let it finish.
REASONING_DOMINANT_SHARE = 0.8
# Repetition of the reasoning text, measured as the share of word 5-grams that repeat an
# earlier one. Natural prose and real reasoning traces stay well below 0.25 (stock
# phrases repeat, whole 5-word spans rarely do); a loop of period P tokens over T tokens
# scores 1 - P/T, so a thought that has gone round its loop twice scores >= 0.5.
RUNAWAY_NGRAM = 5
RUNAWAY_REPEAT_SHARE = 0.5
# Below this many n-grams a repeat share is noise (a short list can repeat legitimately).
RUNAWAY_MIN_NGRAMS = 60
# Text without spaces (CJK, byte-level drill vocabularies) is measured on character
# 12-grams instead; a "word" longer than this many UTF-8 bytes on average means "no word
# boundaries" (a Korean eojeol is ~9 bytes, an unspaced Chinese clause 30+).
RUNAWAY_BYTES_PER_WORD_LIMIT = 20
RUNAWAY_CHAR_NGRAM = 12
# Only the end of a long thought is measured: a thought that "runs away" loops at its
# end, and the window bounds the cost of the check (~1,000 words).
RUNAWAY_WINDOW_CHARS = 6000
# HTTP statuses that are timeouts (request timeout, gateway timeout).
TIMEOUT_STATUSES = frozenset({408, 504})
# Cap on the text scanned for markup and repetition; a runaway thought can be megabytes
# and its first and last parts tell the story.
MAX_SCAN_CHARS = 200_000


class Finding(NamedTuple):
    """One check's verdict on one place in an exchange.

    `score` is how strongly the symptom shows, 0.0 (not at all) to 1.0; `where` is a JSON
    path into the exchange dict (paths continue into JSON-encoded strings such as tool
    arguments); `offset` is a character offset inside the string at `where`, if any.
    (A NamedTuple: immutable, and cheap to build ten thousand times a second.)
    """

    kind: str
    passed: bool
    score: float
    reason: str
    where: str | None = None
    offset: int | None = None

    def to_dict(self) -> JsonObject:
        return {
            "kind": self.kind,
            "passed": self.passed,
            "score": round(float(self.score), 4),
            "reason": self.reason,
            "where": self.where,
            "offset": self.offset,
        }

    def record(self, *, with_offset: bool = False) -> FindingRecord:
        """This finding as a diagnosis holds it (score rounded to 4 places): the exchange's
        findings are recorded without their offset, the model-file lint's with it."""
        return FindingRecord(
            kind=self.kind,
            passed=self.passed,
            score=round(float(self.score), 4),
            reason=self.reason,
            where=self.where,
            offset=self.offset if with_offset else None,
            has_offset=with_offset,
        )


# --------------------------------------------------------------------------------------
# A flat view of the parts of an exchange the checks read
# --------------------------------------------------------------------------------------


@dataclass
class Choice:
    path: str  # JSON path of the message (or of the choice, for text completions)
    content: str
    content_path: str
    reasoning: str
    reasoning_path: str
    tool_calls: list[Any]
    finish_reason: str | None


@dataclass
class View:
    request: JsonObject
    response: JsonObject | None
    error: JsonObject | None
    response_text: str | None
    status: int | None
    truncated: bool
    timed_out: bool
    choices: list[Choice]
    _declared: Any = False  # cache of _declared_tools(request); False = not computed
    # client-view captures: the server's answer re-assembled from the wire (else None)
    wire_response: JsonObject | None = None
    # How long the client waited for this answer, when the capture says (milliseconds).
    elapsed_ms: float | None = None

    def declared_tools(self) -> JsonObject | None:
        if self._declared is False:
            self._declared = _declared_tools(self.request)
        return self._declared  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        parts = []
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def _dict_or_empty(value: Any) -> JsonObject:
    return value if isinstance(value, dict) else {}


def view(exchange: Exchange | Mapping[str, Any]) -> View:
    if isinstance(exchange, Exchange):
        data: Mapping[str, Any] = {
            "request": exchange.request,
            "response": exchange.response,
            "error": exchange.error,
            "response_text": exchange.response_text,
            "status": exchange.status,
            "truncated": exchange.truncated,
            "timed_out": exchange.timed_out,
            "wire_response": exchange.wire_response,
            "elapsed_ms": exchange.elapsed_ms,
        }
    elif isinstance(exchange, Mapping):
        data = exchange
    else:
        data = {}
    response = data.get("response")
    response = response if isinstance(response, dict) else None
    error = data.get("error")
    if not isinstance(error, dict):
        error = None
    if error is None and response is not None and response.get("error") is not None:
        raw = response["error"]
        error = raw if isinstance(raw, dict) else {"message": str(raw)}
    status = data.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        status = None
    choices: list[Choice] = []
    raw_choices = response.get("choices") if response is not None and error is None else None
    if isinstance(raw_choices, list):
        for i, choice in enumerate(raw_choices):
            if not isinstance(choice, dict):
                continue
            base = f"$.response.choices[{i}]"
            message = choice.get("message")
            if not isinstance(message, dict):
                message = choice.get("delta") if isinstance(choice.get("delta"), dict) else None
            finish = choice.get("finish_reason")
            finish = finish if isinstance(finish, str) else None
            if message is None:
                choices.append(
                    Choice(
                        base,
                        _text(choice.get("text")),
                        f"{base}.text",
                        "",
                        f"{base}.text",
                        [],
                        finish,
                    )
                )
                continue
            reasoning_key = "reasoning_content" if "reasoning_content" in message else "reasoning"
            tool_calls = message.get("tool_calls")
            choices.append(
                Choice(
                    path=f"{base}.message",
                    content=_text(message.get("content")),
                    content_path=f"{base}.message.content",
                    reasoning=_text(message.get(reasoning_key)),
                    reasoning_path=f"{base}.message.{reasoning_key}",
                    tool_calls=tool_calls if isinstance(tool_calls, list) else [],
                    finish_reason=finish,
                )
            )
    response_text = data.get("response_text")
    wire = data.get("wire_response")
    elapsed = data.get("elapsed_ms")
    return View(
        request=_dict_or_empty(data.get("request")),
        response=response,
        error=error,
        response_text=response_text if isinstance(response_text, str) else None,
        status=status,
        truncated=data.get("truncated") is True,
        timed_out=data.get("timed_out") is True,
        choices=choices,
        wire_response=wire if isinstance(wire, dict) else None,
        elapsed_ms=float(elapsed)
        if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool)
        else None,
    )


def _no_completion_reason(view: View) -> str:
    if view.error is not None:
        return "no completion to check (the server returned an error)"
    if view.timed_out:
        return "no completion to check (the request timed out)"
    return "no completion to check"


def _declared_tools(request: JsonObject) -> JsonObject | None:
    """Tool name -> parameters schema from `tools` (or legacy `functions`); None if none."""
    tools = request.get("tools")
    declared: JsonObject = {}
    if isinstance(tools, list):
        for tool in tools:
            function = _dict_or_empty(_dict_or_empty(tool).get("function"))
            name = function.get("name")
            if isinstance(name, str):
                declared[name] = function.get("parameters")
    functions = request.get("functions")
    if isinstance(functions, list):
        for function in functions:
            function = _dict_or_empty(function)
            if isinstance(function.get("name"), str):
                declared[function["name"]] = function.get("parameters")
    return declared or None


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------

CheckFn = Callable[[View], list[Finding]]


@runtime_checkable
class Check(Protocol):
    """A symptom check as the catalogue holds it (`catalogue.checks`)."""

    @property
    def id(self) -> str: ...  # the finding kind it reports

    @property
    def number(self) -> int: ...  # stable; stored in family bit masks

    @property
    def user_facing(self) -> bool: ...  # a failed finding means a broken reply for the user

    def run(self, view: View) -> list[Finding]: ...


@dataclass(frozen=True)
class FunctionCheck:
    """A check made from a function (see `check`); calling it runs the function."""

    id: str
    number: int
    user_facing: bool
    func: CheckFn

    def run(self, view: View) -> list[Finding]:
        return self.func(view)

    def __call__(self, view: View) -> list[Finding]:
        return self.func(view)


def check(
    kind: str, *, number: int | None = None, user_facing: bool = True
) -> Callable[[CheckFn], FunctionCheck]:
    """Make a function a `Check` for finding kind `kind`, with its stable `number` (declared
    here, in the check's own file: built-ins 0..31, plugins from 32; see
    triage/plugin_api.py). Register the result with `catalogue.checks.add(...)`.
    """
    if number is None:
        raise ValueError(
            f"finding kind {kind!r} needs a number, declared where the check is defined "
            "(built-ins 0..31, plugins from 32; see triage/plugin_api.py)"
        )

    def make(func: CheckFn) -> FunctionCheck:
        return FunctionCheck(kind, number, user_facing, func)

    return make


@functools.lru_cache(maxsize=512)
def _passed(kind: str, reason: str, where: str | None) -> Finding:
    return Finding(kind, True, 0.0, reason, where)


def _pass(kind: str, reason: str, where: str | None = None) -> list[Finding]:
    return [_passed(kind, reason, where)]
