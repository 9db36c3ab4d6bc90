"""Symptom check `all-thought-reply`: the reply is a long thought and nothing else.

A reply whose reasoning holds at least `MIN_THOUGHT_CHARS` characters while its content is
empty and it calls no tool: the model spent its turn thinking and the user got nothing.
A healthy reply (any content or tool call) and a short empty reply never show it.
"""

from __future__ import annotations

from triage.symptoms import Finding, View, check

KIND = "all-thought-reply"
NUMBER = 32  # stable: stored in family bit sets' text matches; plugins number from 32
# A thought this long is a turn's worth of work (a few hundred tokens), not a stray token.
MIN_THOUGHT_CHARS = 1000


@check(KIND, number=NUMBER)
def all_thought_reply(view: View) -> list[Finding]:
    """Fails each choice that is >= MIN_THOUGHT_CHARS of reasoning with no answer."""
    findings = []
    for choice in view.choices:
        if choice.content.strip() or choice.tool_calls:
            continue
        if len(choice.reasoning) < MIN_THOUGHT_CHARS:
            continue
        findings.append(
            Finding(
                KIND,
                False,
                1.0,
                f"the reply is all thought: {len(choice.reasoning)} chars of reasoning "
                f"(>= {MIN_THOUGHT_CHARS}), no content, no tool call",
                choice.reasoning_path,
            )
        )
    if findings:
        return findings
    return [Finding(KIND, True, 0.0, "the reply is not a thought without an answer")]


ALL_THOUGHT = all_thought_reply
