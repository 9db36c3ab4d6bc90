"""Built-in check on replies that ran into the context end: repetition-to-context-end.

A generation without max_tokens runs until the model ends its turn or the server stops it
at the per-slot context end (or, with context shift on, not at all). A reply that stopped
on a limit the client did not set, and whose tail repeats the same n-grams, is the
signature of a model looping into the context end (llama-server's context-shift runaway).
"""

from __future__ import annotations

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
from triage.checks.content import _completion_tokens, _max_tokens, repeated_ngram_share

KIND = "repetition-to-context-end"


def _limit_not_the_clients(view: View) -> str | None:
    """Why the stop was not the request's max_tokens (None when it may have been)."""
    limit = _max_tokens(view.request)
    if limit is None:
        return "the request sets no max_tokens"
    completion, _, _ = _completion_tokens(view.response)
    if completion is not None and completion < limit:
        return f"{completion} completion tokens, below max_tokens {limit}"
    return None


@check(KIND, number=13)
def check_repetition_to_context_end(view: View) -> list[Finding]:
    """The reply loops until a limit the client did not set (the context end) stops it."""
    if not view.choices:
        return _pass(KIND, _no_completion_reason(view))
    stopped = [c for c in view.choices if c.finish_reason in LENGTH_FINISH_REASONS]
    if not stopped:
        return _pass(KIND, "no reply stopped on a limit")
    why = _limit_not_the_clients(view)
    if why is None:
        return _pass(KIND, "the request's own max_tokens stopped the reply")
    findings = []
    for choice in stopped:
        # The tail of what was generated: the thought, then the answer.
        text = f"{choice.reasoning}\n{choice.content}"
        share = repeated_ngram_share(text)
        if share < RUNAWAY_REPEAT_SHARE:
            continue
        where = choice.content_path if choice.content.strip() else choice.reasoning_path
        findings.append(
            Finding(
                KIND,
                False,
                round(min(1.0, share), 4),
                f"{share:.0%} of the reply's {RUNAWAY_NGRAM}-grams repeat earlier ones up to "
                f"its end, and it stopped on a limit the client did not set ({why})",
                where,
            )
        )
    return findings or _pass(KIND, "the reply does not repeat itself to its end")


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's check to the catalogue."""
    catalogue.checks.add(check_repetition_to_context_end)
