"""Built-in check `stream-format-violation`: a streamed reply whose deltas break the OpenAI
chunk format (triage/capture/stream_format.py says which rules): one finding per bad delta.

The lenient re-assembly of a stream absorbs these (a resent name is not doubled, a missing
index falls back to the position), so the re-assembled reply can look fine while a strict
client -- one that concatenates names, keys calls by `index`, or waits for `id` -- shows a
broken tool call. Each finding's `where` is the violation's event number in the stored
record; the reason names the event (and transcript line) of the bad delta. Replies that were
not streamed, and well formed streams, pass.
"""

from __future__ import annotations

from triage.capture.stream_format import STREAM_FORMAT_KEY
from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _dict_or_empty, _pass, check

KIND = "stream-format-violation"


@check(KIND, number=25)
def check_stream_format(view: View) -> list[Finding]:
    """A streamed delta breaks the OpenAI chunk format."""
    responses = [("$.response", view.response)]
    if view.wire_response is not None:
        responses.append(("$.wire_response", view.wire_response))
    findings: list[Finding] = []
    for base, response in responses:
        record = _dict_or_empty(_dict_or_empty(response).get(STREAM_FORMAT_KEY))
        violations = record.get("violations")
        if not isinstance(violations, list):
            continue
        for i, item in enumerate(violations):
            item = _dict_or_empty(item)
            event = item.get("event")
            line = item.get("line")
            at = f"event {event}" + (f" (line {line})" if isinstance(line, int) else "")
            findings.append(
                Finding(
                    KIND,
                    False,
                    1.0,
                    f"{at}: {str(item.get('problem', 'malformed delta'))[:300]} "
                    f"[{item.get('code', '?')}]",
                    f"{base}.{STREAM_FORMAT_KEY}.violations[{i}].event",
                )
            )
        dropped = record.get("dropped")
        if isinstance(dropped, int) and dropped > 0:
            findings.append(
                Finding(
                    KIND,
                    False,
                    1.0,
                    f"{dropped} more malformed deltas (only the first {len(violations)} kept)",
                    f"{base}.{STREAM_FORMAT_KEY}.dropped",
                )
            )
    return findings or _pass(KIND, "no streamed delta breaks the OpenAI chunk format")


CHECKS = (check_stream_format,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
