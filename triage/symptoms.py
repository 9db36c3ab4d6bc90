"""Pure checks over one exchange: what is wrong with it, and where.

Each check takes an `Exchange` (or its dict form) and returns `Finding`s; `classify` runs
them all. A failed finding is a symptom. Nothing here does I/O, and nothing raises on a
strange exchange: a check that cannot apply passes with a reason that says so.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import best_match

from triage.capture import Exchange

__all__ = [
    "CHECKS",
    "DIAGNOSTIC_KINDS",
    "KINDS",
    "USER_FACING_KINDS",
    "Finding",
    "classify",
    "failure_kinds",
    "is_failure",
    "repeated_ngram_share",
    "symptoms",
]

# Stable ids (the engine, the schema's `finding.kind` and stored evidence use them).
KINDS = (
    "empty-content",
    "length-stop",
    "reasoning-exhausted-budget",
    "runaway-reasoning",
    "tool-args-invalid-json",
    "tool-args-schema-violation",
    "tool-markup-leaked",
    "parse-failure",
    "truncated-stream",
    "http-error",
    "timeout",
)
# What an agent's user sees as a broken reply: nothing, an answer cut off by the token limit
# (OpenAI: "incomplete model output"), a tool call that cannot run, an error, no reply.
# Runaway reasoning only explains a failure: a thought that looped and still ended in a
# complete answer is a working reply (retries "usually succeed" for this reason).
USER_FACING_KINDS = frozenset(
    {
        "empty-content",
        "length-stop",
        "reasoning-exhausted-budget",
        "tool-args-invalid-json",
        "tool-args-schema-violation",
        "tool-markup-leaked",
        "parse-failure",
        "truncated-stream",
        "http-error",
        "timeout",
    }
)
DIAGNOSTIC_KINDS = frozenset(KINDS) - USER_FACING_KINDS

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "passed": self.passed,
            "score": round(float(self.score), 4),
            "reason": self.reason,
            "where": self.where,
            "offset": self.offset,
        }


# --------------------------------------------------------------------------------------
# A flat view of the parts of an exchange the checks read
# --------------------------------------------------------------------------------------


@dataclass
class _Choice:
    path: str  # JSON path of the message (or of the choice, for text completions)
    content: str
    content_path: str
    reasoning: str
    reasoning_path: str
    tool_calls: list[Any]
    finish_reason: str | None


@dataclass
class _View:
    request: dict[str, Any]
    response: dict[str, Any] | None
    error: dict[str, Any] | None
    response_text: str | None
    status: int | None
    truncated: bool
    timed_out: bool
    choices: list[_Choice]
    _declared: Any = False  # cache of _declared_tools(request); False = not computed

    def declared_tools(self) -> dict[str, Any] | None:
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


def _dict_or_empty(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _view(exchange: Exchange | Mapping[str, Any]) -> _View:
    if isinstance(exchange, Exchange):
        data: Mapping[str, Any] = {
            "request": exchange.request,
            "response": exchange.response,
            "error": exchange.error,
            "response_text": exchange.response_text,
            "status": exchange.status,
            "truncated": exchange.truncated,
            "timed_out": exchange.timed_out,
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
    choices: list[_Choice] = []
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
                    _Choice(
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
                _Choice(
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
    return _View(
        request=_dict_or_empty(data.get("request")),
        response=response,
        error=error,
        response_text=response_text if isinstance(response_text, str) else None,
        status=status,
        truncated=data.get("truncated") is True,
        timed_out=data.get("timed_out") is True,
        choices=choices,
    )


def _no_completion_reason(view: _View) -> str:
    if view.error is not None:
        return "no completion to check (the server returned an error)"
    if view.timed_out:
        return "no completion to check (the request timed out)"
    return "no completion to check"


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

CheckFn = Callable[[_View], list[Finding]]
CHECKS: dict[str, CheckFn] = {}


def check(kind: str) -> Callable[[CheckFn], CheckFn]:
    """Register a check under its stable kind id."""
    if kind not in KINDS:
        raise ValueError(f"unknown finding kind {kind!r}")

    def register(func: CheckFn) -> CheckFn:
        CHECKS[kind] = func
        return func

    return register


@functools.lru_cache(maxsize=512)
def _passed(kind: str, reason: str, where: str | None) -> Finding:
    return Finding(kind, True, 0.0, reason, where)


def _pass(kind: str, reason: str, where: str | None = None) -> list[Finding]:
    return [_passed(kind, reason, where)]


# --------------------------------------------------------------------------------------
# Content and budget
# --------------------------------------------------------------------------------------


@check("empty-content")
def check_empty_content(view: _View) -> list[Finding]:
    """The reply has no content and no tool call: the agent has nothing to show or run."""
    if not view.choices:
        return _pass("empty-content", _no_completion_reason(view))
    findings = []
    for choice in view.choices:
        if choice.content.strip() or choice.tool_calls:
            continue
        detail = [f"finish_reason={choice.finish_reason}"] if choice.finish_reason else []
        if choice.reasoning:
            detail.append(f"reasoning_content holds {len(choice.reasoning)} chars")
        suffix = f" ({', '.join(detail)})" if detail else ""
        empty = "empty" if not choice.content else "whitespace only"
        findings.append(
            Finding(
                "empty-content",
                False,
                1.0,
                f"content is {empty} and there is no tool call{suffix}",
                choice.content_path,
            )
        )
    return findings or _pass("empty-content", "content present", view.choices[0].content_path)


@check("length-stop")
def check_length_stop(view: _View) -> list[Finding]:
    """Generation stopped at the token limit."""
    if not view.choices:
        return _pass("length-stop", _no_completion_reason(view))
    findings = []
    for i, choice in enumerate(view.choices):
        if choice.finish_reason in LENGTH_FINISH_REASONS:
            limit = _max_tokens(view.request)
            limit_text = f" (max_tokens {limit})" if limit is not None else ""
            findings.append(
                Finding(
                    "length-stop",
                    False,
                    1.0,
                    f"finish_reason is {choice.finish_reason!r}: "
                    f"the token limit ended the reply{limit_text}",
                    f"$.response.choices[{i}].finish_reason",
                )
            )
    if findings:
        return findings
    reasons = sorted({c.finish_reason or "none" for c in view.choices})
    return _pass("length-stop", f"finish_reason {', '.join(reasons)}")


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _max_tokens(request: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = _int_or_none(request.get(key))
        if value is not None and value > 0:
            return value
    return None


def _completion_tokens(response: dict[str, Any] | None) -> tuple[int | None, int | None, str]:
    """(completion tokens, reasoning tokens if reported, where the count came from)."""
    if response is None:
        return None, None, ""
    usage = _dict_or_empty(response.get("usage"))
    details = _dict_or_empty(usage.get("completion_tokens_details"))
    reasoning = _int_or_none(details.get("reasoning_tokens"))
    completion = _int_or_none(usage.get("completion_tokens"))
    if completion is not None:
        return completion, reasoning, "$.response.usage.completion_tokens"
    predicted = _int_or_none(_dict_or_empty(response.get("timings")).get("predicted_n"))
    if predicted is not None:
        return predicted, reasoning, "$.response.timings.predicted_n"
    verbose = _int_or_none(_dict_or_empty(response.get("__verbose")).get("tokens_predicted"))
    if verbose is not None:
        return verbose, reasoning, "$.response.__verbose.tokens_predicted"
    return None, reasoning, ""


def _tool_args_chars(tool_calls: list[Any]) -> int:
    total = 0
    for call in tool_calls:
        function = _dict_or_empty(_dict_or_empty(call).get("function"))
        args = function.get("arguments")
        if isinstance(args, str):
            total += len(args)
        elif args is not None:
            total += 2
        name = function.get("name")
        if isinstance(name, str):
            total += len(name)
    return total


@check("reasoning-exhausted-budget")
def check_reasoning_budget(view: _View) -> list[Finding]:
    """The thinking channel used up the token budget before the answer was written."""
    kind = "reasoning-exhausted-budget"
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    completion, reasoning_tokens, _ = _completion_tokens(view.response)
    limit = _max_tokens(view.request)
    findings = []
    for choice in view.choices:
        if not choice.reasoning:
            continue
        visible_chars = len(choice.content.strip()) + _tool_args_chars(choice.tool_calls)
        hit_limit = choice.finish_reason in LENGTH_FINISH_REASONS or (
            completion is not None and limit is not None and completion >= limit
        )
        if not hit_limit:
            continue
        reasoning_chars = len(choice.reasoning)
        if reasoning_tokens is not None and completion:
            share = min(1.0, reasoning_tokens / completion)
            basis = f"{reasoning_tokens} of {completion} completion tokens are reasoning"
        else:
            share = reasoning_chars / (reasoning_chars + visible_chars)
            if completion:
                basis = (
                    f"reasoning is {share:.0%} of the generated text, "
                    f"so ~{round(share * completion)} of {completion} completion tokens"
                )
            else:
                basis = f"reasoning is {share:.0%} of the generated text"
        short = visible_chars < SHORT_CONTENT_CHARS or share >= REASONING_DOMINANT_SHARE
        if share <= REASONING_MAJORITY_SHARE or not short:
            continue
        limit_text = f"max_tokens {limit}" if limit is not None else "the token limit"
        findings.append(
            Finding(
                kind,
                False,
                round(share, 4),
                f"{limit_text} ran out in the thinking channel: {basis}; "
                f"visible output is {visible_chars} chars",
                choice.reasoning_path,
            )
        )
    return findings or _pass(kind, "the budget was not spent on reasoning alone")


# --------------------------------------------------------------------------------------
# Runaway reasoning
# --------------------------------------------------------------------------------------


def _repeat_share(grams: list[int]) -> float:
    """Share of repeated n-grams over the whole list and over its second half (the max)."""
    total = len(grams)
    if total < RUNAWAY_MIN_NGRAMS:
        return 0.0
    whole = 1.0 - len(set(grams)) / total
    # A loop that starts late is diluted in the whole text; the second half shows it.
    tail = grams[total // 2 :]
    if len(tail) < RUNAWAY_MIN_NGRAMS:
        return whole
    return max(whole, 1.0 - len(set(tail)) / len(tail))


# ASCII punctuation becomes a space: table borders and bullets ("|", "+----+", "-") repeat
# in any structured text and say nothing about looping. (bytes.translate runs in C.)
_PUNCTUATION = b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_PUNCT_TO_SPACE = bytes.maketrans(_PUNCTUATION, b" " * len(_PUNCTUATION))


def repeated_ngram_share(text: str) -> float:
    """Share of n-grams that repeat an earlier one (0 = no repetition, ~1 = a tight loop).

    Word 5-grams; text without word boundaries (CJK, byte-level drill vocabularies) uses
    character 12-grams. Only the last RUNAWAY_WINDOW_CHARS are measured.
    """
    if len(text) > RUNAWAY_WINDOW_CHARS:
        text = text[-RUNAWAY_WINDOW_CHARS:]
    data = text.encode("utf-8", "surrogatepass").translate(_PUNCT_TO_SPACE)
    words = data.split()
    if not words:
        return 0.0
    # len(data) also counts separators, so it bounds the word length from above: only a
    # text that might lack word boundaries pays for the exact average.
    if (
        len(data) / len(words) <= RUNAWAY_BYTES_PER_WORD_LIMIT
        or sum(map(len, words)) / len(words) <= RUNAWAY_BYTES_PER_WORD_LIMIT
    ):
        count = len(words) - RUNAWAY_NGRAM + 1
        if count < RUNAWAY_MIN_NGRAMS:
            return 0.0
        columns = (words[i : i + count] for i in range(RUNAWAY_NGRAM))
        return _repeat_share(list(map(hash, zip(*columns, strict=True))))
    compact = b"".join(words).decode("utf-8", "ignore")
    size = RUNAWAY_CHAR_NGRAM
    return _repeat_share(
        list(map(hash, (compact[i : i + size] for i in range(len(compact) - size + 1))))
    )


@check("runaway-reasoning")
def check_runaway_reasoning(view: _View) -> list[Finding]:
    """The thinking channel repeats itself: a loop instead of progress."""
    kind = "runaway-reasoning"
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    findings = []
    best = 0.0
    for choice in view.choices:
        if not choice.reasoning:
            continue
        share = repeated_ngram_share(choice.reasoning)
        best = max(best, share)
        if share >= RUNAWAY_REPEAT_SHARE:
            findings.append(
                Finding(
                    kind,
                    False,
                    round(min(1.0, share), 4),
                    f"{share:.0%} of the reasoning's {RUNAWAY_NGRAM}-grams repeat earlier ones "
                    f"(threshold {RUNAWAY_REPEAT_SHARE:.0%}) over {len(choice.reasoning)} chars",
                    choice.reasoning_path,
                )
            )
    if findings:
        return findings
    if not any(c.reasoning for c in view.choices):
        return _pass(kind, "no reasoning text")
    return [Finding(kind, True, round(best, 4), f"reasoning repeats {best:.0%} of its n-grams")]


# --------------------------------------------------------------------------------------
# Tool calls
# --------------------------------------------------------------------------------------


def _iter_tool_calls(view: _View) -> Iterable[tuple[str, str | None, Any]]:
    """(JSON path of arguments, tool name, raw arguments) for every tool call."""
    for choice in view.choices:
        for j, call in enumerate(choice.tool_calls):
            function = _dict_or_empty(_dict_or_empty(call).get("function"))
            name = function.get("name")
            yield (
                f"{choice.path}.tool_calls[{j}].function.arguments",
                name if isinstance(name, str) else None,
                function.get("arguments"),
            )


def _parse_arguments(raw: Any) -> tuple[Any, str | None, int | None]:
    """(parsed arguments, error, char offset of the error)."""
    if isinstance(raw, dict):
        return raw, None, None
    if raw is None:
        return None, "arguments are missing", None
    if not isinstance(raw, str):
        return None, f"arguments are a JSON {type(raw).__name__}, not an object string", None
    if not raw.strip():
        return None, "arguments are an empty string (JSON.parse fails on it)", 0
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"arguments are not valid JSON: {exc.msg} at char {exc.pos}", exc.pos
    except (ValueError, RecursionError) as exc:
        return None, f"arguments are not valid JSON: {type(exc).__name__}", None
    if not isinstance(value, dict):
        return None, f"arguments are JSON but a {type(value).__name__}, not an object", 0
    return value, None, None


@check("tool-args-invalid-json")
def check_tool_args_json(view: _View) -> list[Finding]:
    """Every tool call's arguments parse as a JSON object."""
    kind = "tool-args-invalid-json"
    findings = []
    count = 0
    for path, name, raw in _iter_tool_calls(view):
        count += 1
        _, error, offset = _parse_arguments(raw)
        if error is not None:
            label = f"tool call {name!r}: " if name else "tool call: "
            findings.append(Finding(kind, False, 1.0, label + error, path, offset))
    if findings:
        return findings
    return _pass(
        kind, f"{count} tool call(s) with JSON-object arguments" if count else "no tool calls"
    )


_VALIDATOR_CACHE: dict[str, Any] = {}
_VALIDATOR_CACHE_LIMIT = 256


def _validator(schema: Any) -> Any:
    """A cached validator for a tool's parameter schema, or None if the schema is unusable."""
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return None
    if key in _VALIDATOR_CACHE:
        return _VALIDATOR_CACHE[key]
    validator = None
    if isinstance(schema, dict):
        try:
            cls = jsonschema.validators.validator_for(
                schema, default=jsonschema.Draft202012Validator
            )
            cls.check_schema(schema)
            validator = cls(schema)
        except Exception:  # noqa: BLE001 -- a broken tool schema is the client's problem
            validator = None
    if len(_VALIDATOR_CACHE) >= _VALIDATOR_CACHE_LIMIT:
        _VALIDATOR_CACHE.clear()
    _VALIDATOR_CACHE[key] = validator
    return validator


def _declared_tools(request: dict[str, Any]) -> dict[str, Any] | None:
    """Tool name -> parameters schema from `tools` (or legacy `functions`); None if none."""
    tools = request.get("tools")
    declared: dict[str, Any] = {}
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


@check("tool-args-schema-violation")
def check_tool_args_schema(view: _View) -> list[Finding]:
    """Tool-call arguments validate against the request's tools[].function.parameters."""
    kind = "tool-args-schema-violation"
    calls = list(_iter_tool_calls(view))
    if not calls:
        return _pass(kind, "no tool calls")
    declared = view.declared_tools()
    if declared is None:
        return _pass(kind, "the request declares no tools (or is not in the capture); not checked")
    findings = []
    for path, name, raw in calls:
        if name not in declared:
            findings.append(
                Finding(
                    kind,
                    False,
                    1.0,
                    f"tool {name!r} is not among the request's tools "
                    f"({', '.join(sorted(declared))})",
                    path.rsplit(".arguments", 1)[0] + ".name",
                )
            )
            continue
        arguments, error, _ = _parse_arguments(raw)
        if error is not None:
            continue  # tool-args-invalid-json reports it
        schema = declared[name]
        if schema is None:
            continue
        validator = _validator(schema)
        if validator is None:
            continue
        try:
            errors = list(validator.iter_errors(arguments))
        except Exception:  # noqa: BLE001 -- unresolvable $ref and the like: cannot judge
            continue
        if errors:
            error_obj = best_match(errors)
            inner = error_obj.json_path[1:]  # "$.a.b" -> ".a.b"
            findings.append(
                Finding(
                    kind,
                    False,
                    1.0,
                    f"tool {name!r} arguments violate its schema: {error_obj.message[:300]}",
                    path + inner,
                )
            )
    return findings or _pass(kind, f"{len(calls)} tool call(s) match their schemas")


# Tool-call syntax of the chat templates llama-server serves; seen in the text, it means
# the server's parser did not turn the call into `tool_calls`.
_MARKUP = re.compile(
    r"<\|tool_call>|<tool_call\|>|<\|\"\|>"  # Gemma 4
    r"|(?<![\w.])call:[A-Za-z_][\w.\-]*\{"  # Gemma 4 call body
    r"|</?tool_call>"  # Hermes / Qwen
    r"|<\|tool_calls_section_begin\|>|<\|tool_call_begin\|>"  # Kimi
    r"|<｜tool▁calls?▁begin｜>"  # DeepSeek
    r"|\[TOOL_CALLS\]"  # Mistral
    r"|<\|python_tag\|>"  # Llama 3.x
    r"|<function=[\w.\-]+>"  # Qwen3-Coder / Llama XML calls
    r"|<\|channel\|>commentary to=functions\."  # gpt-oss harmony
)
# Every alternative of _MARKUP contains one of these literals.
_MARKUP_TRIGGERS = ("<|", "call:", "tool_call", "<\uff5c", "[TOOL_CALLS]", "<function=")
_BARE_CALL = re.compile(
    r"\{\s*\"(?:name|function)\"\s*:\s*\"([^\"\\]{1,128})\"\s*,\s*\"(?:arguments|parameters)\"\s*:"
)
# A bare {"name": ..., "arguments": ...} is only a leak when it names a declared tool; with
# no request in the capture it is likely one, but not certain.
BARE_CALL_UNKNOWN_REQUEST_SCORE = 0.5


@check("tool-markup-leaked")
def check_tool_markup(view: _View) -> list[Finding]:
    """Tool-call syntax appears as text in content or reasoning instead of in tool_calls."""
    kind = "tool-markup-leaked"
    if not view.choices:
        return _pass(kind, _no_completion_reason(view))
    declared = view.declared_tools()
    request_known = bool(view.request)
    findings = []
    for choice in view.choices:
        for text, path, channel in (
            (choice.content, choice.content_path, "content"),
            (choice.reasoning, choice.reasoning_path, "reasoning"),
        ):
            if not text:
                continue
            scanned = text[:MAX_SCAN_CHARS]
            # Substring tests run in C; the regex only runs on text that may hold markup.
            has_markup = any(trigger in scanned for trigger in _MARKUP_TRIGGERS)
            match = _MARKUP.search(scanned) if has_markup else None
            if match:
                findings.append(
                    Finding(
                        kind,
                        False,
                        1.0,
                        f"tool-call markup {match.group(0)!r} in {channel} "
                        "(the call was not parsed)",
                        path,
                        match.start(),
                    )
                )
                continue
            if '"name"' not in scanned and '"function"' not in scanned:
                continue
            for bare in _BARE_CALL.finditer(scanned):
                name = bare.group(1)
                if declared is not None and name in declared:
                    score = 1.0
                elif not request_known:
                    score = BARE_CALL_UNKNOWN_REQUEST_SCORE
                else:
                    continue
                findings.append(
                    Finding(
                        kind,
                        False,
                        score,
                        f'a bare tool call {{"name": {name!r}, "arguments": ...}} in {channel}'
                        + (
                            ""
                            if score == 1.0
                            else " (request not captured: cannot tell it is a declared tool)"
                        ),
                        path,
                        bare.start(),
                    )
                )
                break
    return findings or _pass(kind, "no tool-call markup in content or reasoning")


# --------------------------------------------------------------------------------------
# Transport
# --------------------------------------------------------------------------------------

_PARSE_FAILURE = re.compile(
    r"does not match the expected (?P<format>[\w.\- ]{1,60}?) format"  # llama.cpp PEG parsers
    r"|Failed to parse tool call arguments as JSON"
    r"|Failed to parse input at pos \d+"  # older chat parsers
    r"|Invalid diff: "
)


def _error_message(view: _View) -> str:
    if view.error is not None:
        message = view.error.get("message")
        if isinstance(message, str):
            return message
        return json.dumps(view.error, default=str)[:2000]
    return ""


@check("parse-failure")
def check_parse_failure(view: _View) -> list[Finding]:
    """llama-server could not parse the model's output into a message (HTTP 500 / stream error)."""
    kind = "parse-failure"
    for text, where in (
        (_error_message(view), "$.error.message"),
        (view.response_text or "", "$.response_text"),
    ):
        if not text:
            continue
        match = _PARSE_FAILURE.search(text)
        if match:
            fmt = match.group("format")
            label = f"the {fmt} parser" if fmt else "the chat parser"
            status = f"HTTP {view.status}: " if view.status else ""
            in_stream = view.error is not None and view.error.get("in_stream") is True
            return [
                Finding(
                    kind,
                    False,
                    1.0,
                    f"{status}{label} rejected the model output"
                    f"{' mid-stream' if in_stream else ''}: {text[:200]}",
                    where,
                    match.start(),
                )
            ]
    return _pass(kind, "no parser error")


@check("truncated-stream")
def check_truncated(view: _View) -> list[Finding]:
    """The stream ended without [DONE] and without a finish_reason."""
    if view.truncated:
        return [
            Finding(
                "truncated-stream",
                False,
                1.0,
                "the stream ended without [DONE] or a finish_reason (connection cut?)",
                "$.truncated",
            )
        ]
    return _pass("truncated-stream", "stream complete (or not streamed)")


@check("http-error")
def check_http_error(view: _View) -> list[Finding]:
    """The server answered with an error status or an error object (also mid-stream)."""
    kind = "http-error"
    message = _error_message(view)[:300]
    if view.status is not None and view.status >= 400:
        return [
            Finding(
                kind,
                False,
                1.0,
                f"HTTP {view.status}" + (f": {message}" if message else ""),
                "$.status",
            )
        ]
    if view.error is not None:
        in_stream = view.error.get("in_stream") is True
        prefix = "error event mid-stream" if in_stream else "error response"
        return [Finding(kind, False, 1.0, f"{prefix}: {message}", "$.error")]
    if view.response is None and not view.timed_out and view.response_text is None:
        return [Finding(kind, False, 1.0, "no response body", "$.response")]
    return _pass(kind, f"HTTP {view.status}" if view.status else "no error")


@check("timeout")
def check_timeout(view: _View) -> list[Finding]:
    """The request timed out (client-side, or a 408/504 from a proxy)."""
    if view.timed_out:
        return [Finding("timeout", False, 1.0, "the request timed out", "$.timed_out")]
    if view.status in TIMEOUT_STATUSES:
        return [Finding("timeout", False, 1.0, f"HTTP {view.status} (timeout)", "$.status")]
    return _pass("timeout", "no timeout")


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def classify(exchange: Exchange | Mapping[str, Any]) -> list[Finding]:
    """All findings (passed and failed) for one exchange, in KINDS order."""
    view = _view(exchange)
    findings: list[Finding] = []
    for kind in KINDS:
        findings.extend(CHECKS[kind](view))
    return findings


def symptoms(exchange: Exchange | Mapping[str, Any]) -> list[Finding]:
    """Only the failed findings."""
    return [f for f in classify(exchange) if not f.passed]


def failure_kinds(exchange: Exchange | Mapping[str, Any]) -> set[str]:
    """Kinds of all failed findings (user-facing and diagnostic)."""
    return {f.kind for f in classify(exchange) if not f.passed}


def is_failure(exchange: Exchange | Mapping[str, Any]) -> bool:
    """Whether a reply is broken for its user: any failed finding of a USER_FACING_KINDS kind."""
    return bool(failure_kinds(exchange) & USER_FACING_KINDS)
