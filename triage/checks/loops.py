"""Built-in check on natural-language loops: repetition-loop (issue 23).

A small real model that loops writes ordinary words -- "Abe aria, aria of the sea," or
"51. Let the bread rest for 1 hour before it is ready to be baked." -- until something stops
it: the context end, the request's own max_tokens, the client. The reply then stops on a
limit, not on its own, and its visible answer repeats itself up to that point. Measured on
word 5-grams (character 12-grams for text without word boundaries) over the tail of the
answer, with every run of digits read as one token, so a numbered list that counts on while
repeating the same line is the loop it is. An answer that repeats a phrase and then ends on
its own is not a loop; the thought's loops are `runaway-reasoning`'s.
"""

from __future__ import annotations

import re

from triage.catalogue import Catalogue
from triage.checks.base import (
    LENGTH_FINISH_REASONS,
    RUNAWAY_NGRAM,
    RUNAWAY_REPEAT_SHARE,
    Finding,
    View,
    _no_completion_reason,
    _pass,
    check,
)
from triage.checks.content import repeated_ngram_share

KIND = "repetition-loop"
_DIGITS = re.compile(r"\d+")


def loop_share(text: str) -> float:
    """Share of the text's n-grams that repeat an earlier one, digit runs read as one token
    (0 = none, ~1 = a tight loop)."""
    return repeated_ngram_share(_DIGITS.sub("0", text))


@check(KIND, number=18)
def check_repetition_loop(view: View) -> list[Finding]:
    """The answer repeats itself up to where a limit cut it: a loop, not an answer."""
    if not view.choices:
        return _pass(KIND, _no_completion_reason(view))
    findings = []
    best = 0.0
    for choice in view.choices:
        if choice.finish_reason not in (*LENGTH_FINISH_REASONS, None) or not choice.content:
            continue
        share = loop_share(choice.content)
        best = max(best, share)
        if share < RUNAWAY_REPEAT_SHARE:
            continue
        stop = choice.finish_reason or "no finish reason"
        findings.append(
            Finding(
                KIND,
                False,
                round(min(1.0, share), 4),
                f"{share:.0%} of the answer's {RUNAWAY_NGRAM}-grams repeat earlier ones "
                f"(threshold {RUNAWAY_REPEAT_SHARE:.0%}) over {len(choice.content)} chars, "
                f"and it did not end on its own ({stop}): the model is looping",
                choice.content_path,
            )
        )
    return findings or _pass(KIND, f"no answer cut while looping (repeats {best:.0%})")


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's check to the catalogue."""
    catalogue.checks.add(check_repetition_loop)
