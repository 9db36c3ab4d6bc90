"""Built-in check on client-view captures: client-lost-reply.

A client-view capture holds the server's answer as it crossed the wire (`wire_response`,
re-assembled by triage from the raw SSE stream) and what the client showed (`response`).
The check fails when the client's view lost tool calls the server sent, or shows content
other than the server's. Reasoning the client did not show is noted but passes: many
clients hide the thought on purpose. Other captures (and live replies) hold no wire view:
the check passes with "no client view".
"""

from __future__ import annotations

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _pass, check, view

KIND = "client-lost-reply"


def _calls(names: list[str]) -> str:
    return ", ".join(names) or "none"


def _names(tool_calls: list[object]) -> list[str]:
    out = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        out.append(name if isinstance(name, str) else "?")
    return out


@check(KIND, number=16)
def client_lost_reply(v: View) -> list[Finding]:
    if v.wire_response is None:
        return _pass(KIND, "no client view in this capture")
    wire = view({"response": v.wire_response})
    findings = []
    for index, sent in enumerate(wire.choices):
        shown = v.choices[index] if index < len(v.choices) else None
        where = f"$.response.choices[{index}].message"
        sent_calls, shown_calls = _names(sent.tool_calls), _names(shown.tool_calls if shown else [])
        lost = []
        if len(shown_calls) < len(sent_calls) or shown_calls != sent_calls[: len(shown_calls)]:
            lost.append(
                f"tool calls: the server sent {_calls(sent_calls)}, "
                f"the client shows {_calls(shown_calls)}"
            )
        shown_content = shown.content if shown else ""
        if shown_content != sent.content:
            lost.append(
                f"content: the server sent {len(sent.content)} chars, the client shows "
                f"{len(shown_content)} chars that differ"
            )
        if lost:
            findings.append(Finding(KIND, False, 1.0, "; ".join(lost), where))
        elif sent.reasoning and not (shown and shown.reasoning):
            findings.append(
                Finding(KIND, True, 0.0, "the client hides the reasoning only (not a loss)", where)
            )
    return findings or _pass(KIND, "the client shows what the server sent")


def register(catalogue: Catalogue) -> None:
    catalogue.checks.add(client_lost_reply)
