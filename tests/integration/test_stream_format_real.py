"""stream-format-violation on the real llama-server (issue 24): the drill server's streamed
tool call (b11434, recorded here) is well formed -- the check passes on the re-assembled wire
stream -- and the same real stream with the function name resent in a later delta (what a
server that breaks the format sends; constructed, not observed on b11434) is reported at that
delta's event.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triage.capture import load_file
from triage.capture.stream_format import STREAM_FORMAT_KEY
from triage.checks.stream_format import KIND
from triage.drills import build_drill
from triage.drills.client import STREAM_DRILL, client_view_capture, record_capture
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _resend_name(stream: str) -> tuple[str, int]:
    """The stream with `function.name` added to the second tool-call delta; its event."""
    lines, event, seen = [], 0, 0
    target = -1
    for line in stream.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            event += 1
            chunk = json.loads(line[5:])
            calls = chunk["choices"][0]["delta"].get("tool_calls") if chunk["choices"] else None
            if calls:
                seen += 1
                if seen == 2:
                    calls[0]["function"]["name"] = "get_weather"
                    target = event
                    line = "data: " + json.dumps(chunk)
        lines.append(line)
    return "\n".join(lines) + "\n", target


def test_real_stream_is_well_formed_and_a_resent_name_is_caught(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(STREAM_DRILL, tmp_path / "drill")
    (exchange,) = load_file(record_capture(drill, tmp_path))
    wire = exchange.wire_response
    assert wire is not None and STREAM_FORMAT_KEY not in wire
    assert wire["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    (finding,) = [f for f in classify(exchange) if f.kind == KIND]
    assert finding.passed, finding

    raw = json.loads((tmp_path / "client-view.json").read_text())["stream"]
    broken, event = _resend_name(raw)
    assert event > 0, "the real stream has fewer than two tool-call deltas"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(client_view_capture(exchange.request, broken)))
    (bad,) = load_file(path)
    failed = [f for f in classify(bad) if f.kind == KIND and not f.passed]
    assert len(failed) == 1
    assert (
        failed[0].reason.startswith(f"event {event} ") and "tool-name-repeated" in failed[0].reason
    )
    # The lenient re-assembly still shows one name: only the strict check sees the break.
    assert bad.wire_response is not None
    assert bad.wire_response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == (
        "get_weather"
    )
