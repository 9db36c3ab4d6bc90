"""Built-in checks on the reply's content and token budget: empty-content, length-stop,
reasoning-exhausted-budget, runaway-reasoning."""

from __future__ import annotations

from typing import Any

from kb.jsontypes import JsonObject
from triage.catalogue import Catalogue
from triage.checks.base import (
    LENGTH_FINISH_REASONS,
    REASONING_DOMINANT_SHARE,
    REASONING_MAJORITY_SHARE,
    RUNAWAY_BYTES_PER_WORD_LIMIT,
    RUNAWAY_CHAR_NGRAM,
    RUNAWAY_MIN_NGRAMS,
    RUNAWAY_NGRAM,
    RUNAWAY_REPEAT_SHARE,
    RUNAWAY_WINDOW_CHARS,
    SHORT_CONTENT_CHARS,
    Finding,
    View,
    _dict_or_empty,
    _no_completion_reason,
    _pass,
    check,
)

# --------------------------------------------------------------------------------------
# Content and budget
# --------------------------------------------------------------------------------------


@check("empty-content", number=0)
def check_empty_content(view: View) -> list[Finding]:
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


@check("length-stop", number=1)
def check_length_stop(view: View) -> list[Finding]:
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


def _max_tokens(request: JsonObject) -> int | None:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = _int_or_none(request.get(key))
        if value is not None and value > 0:
            return value
    return None


def _completion_tokens(response: JsonObject | None) -> tuple[int | None, int | None, str]:
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


@check("reasoning-exhausted-budget", number=2)
def check_reasoning_budget(view: View) -> list[Finding]:
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


@check("runaway-reasoning", number=3, user_facing=False)
def check_runaway_reasoning(view: View) -> list[Finding]:
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


CHECKS = (check_empty_content, check_length_stop, check_reasoning_budget, check_runaway_reasoning)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
