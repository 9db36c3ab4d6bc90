"""Issue 17: the retrospective's timeline shows real changes only, and a diagnosed incident
gets its fix options with removal and decode-speed change side by side, each cited."""

from __future__ import annotations

import re
from typing import Any

from kb.domain.retro import retro_markdown

AT = "2026-07-01T10:00:00Z"
LATER = "2026-07-02T10:00:00Z"


def _arm(
    key: str,
    arm: str,
    decision: str,
    failures: int,
    n: int,
    speed: float | None,
    at: str = AT,
    p_value: float | None = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "arm",
        "arm": arm,
        "variant": f"{arm} variant",
        "n": n,
        "failures": failures,
        "decision": decision,
    }
    if speed is not None:
        payload["speed_tok_s"] = speed
    if p_value is not None:
        payload["p_value"] = p_value
    return {
        "id": key,
        "kind": "measurement",
        "summary": f"arm {arm}: {failures}/{n} failed",
        "recorded_at": at,
        "payload": payload,
    }


def _change(
    frm: str | None, to: str, at: str, rationale: str, evidence: list[str] | None = None
) -> dict[str, Any]:
    change: dict[str, Any] = {"to": to, "at": at, "actor": "engine", "rationale": rationale}
    if frm:
        change["from"] = frm
    if evidence:
        change["evidence"] = evidence
    return change


def _diagnosed() -> dict[str, Any]:
    planned = "candidate cause from the catalogue, before any probe"
    return {
        "slug": "2026-07-01-diagnosed",
        "title": "Diagnosed drill",
        "status": "open",
        "opened": "2026-07-01",
        "evidence": [
            _arm("E1", "baseline", "baseline", 6, 16, 1437.0),
            _arm("E2", "spec-off", "removes", 0, 16, 1000.0, p_value=0.0177),
            _arm("E3", "thinking-off", "removes", 0, 16, 1500.0, p_value=0.0177),
            _arm("E4", "baseline", "baseline", 8, 16, 1400.0, at=LATER),
            _arm("E5", "thinking-off", "unchanged", 7, 16, 1450.0, at=LATER),
        ],
        "causes": [
            {
                "id": "speculative-decoding",
                "title": "Speculative decoding",
                "status": "confirmed",
                "basis": "measured",
                "history": [
                    _change(None, "suspected", AT, planned),
                    _change("suspected", "confirmed", AT, "spec-off removes it", ["E2"]),
                    _change("confirmed", "confirmed", LATER, "spec-off removes it", ["E2"]),
                ],
            },
            {
                "id": "token-limit",
                "title": "Token limit",
                "status": "suspected",
                "basis": "untested",
                "history": [_change(None, "suspected", AT, planned)],
            },
        ],
    }


def _section(markdown: str, title: str) -> list[str]:
    part = markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in part.splitlines() if line.strip()]


def test_timeline_has_real_changes_only() -> None:
    timeline = _section(retro_markdown(_diagnosed()), "Timeline")
    # The catalogue's candidates (opened with no evidence) and the rerun that confirmed a
    # confirmed cause again are no changes: one line, the real move, cited.
    assert timeline == [
        "- **2026-07-01 10:00 UTC**: engine: `speculative-decoding` suspected -\\> confirmed. "
        "\\[[E2](#e2)\\]"
    ]


def test_causes_are_one_line_each_and_uncited_ones_are_marked() -> None:
    causes = _section(retro_markdown(_diagnosed()), "Causes")
    assert len(causes) == 2
    assert causes[0].startswith(
        "- **Speculative decoding (`speculative-decoding`), confirmed, measured**: "
        "spec-off removes it \\[[E2]"
    )
    assert causes[1] == (
        "- *Token limit (`token-limit`), suspected, untested: no evidence on record.*"
    )


def test_causes_with_no_evidence_share_one_line_that_names_each() -> None:
    record = _diagnosed()
    planned = "candidate cause from the catalogue, before any probe"
    record["causes"] += [
        {
            "id": "model-file",
            "title": "The GGUF conversion",
            "status": "suspected",
            "basis": "untested",
            "deciding_probe": "alt-weights of the same quant type",
            "history": [_change(None, "suspected", AT, planned)],
        },
        {
            "id": "kv-cache-quant",
            "title": "The quantized KV cache",
            "status": "rejected",
            "basis": "measured",
            "deciding_probe": "server args (-ctk/-ctv)",
            "history": [_change(None, "rejected", AT, planned)],
        },
    ]
    causes = _section(retro_markdown(record), "Causes")
    assert len(causes) == 2  # the measured cause, then one line for the three others
    assert causes[1] == (
        "- *No evidence on record for 3 causes: `kv-cache-quant` rejected (by `server args "
        "(-ctk/-ctv)`); `token-limit` suspected; `model-file` suspected (needs `alt-weights "
        "of the same quant type`).*"
    )


def test_fix_options_show_removal_and_speed_side_by_side_with_citations() -> None:
    options = _section(retro_markdown(_diagnosed()), "Fix options")
    # thinking-off removed it in the first run but not in the later one: not an option.
    assert len(options) == 1
    (line,) = options
    assert line.startswith("- **spec-off** (spec-off variant): removes the failure, ")
    assert "0/16 failed vs 6/16 failed, p = 0.018 vs baseline" in line
    assert "decode speed 1437 -> 1000 tok/s (-30%)" in line
    cited = re.findall(r"\[(E\d+)\]\(#e\d+\)", line)
    assert cited == ["E2", "E1"]


def test_fix_options_print_the_one_sided_p_the_decision_uses() -> None:
    record = _diagnosed()
    record["evidence"][1]["payload"]["p_less"] = 0.00885
    (line,) = _section(retro_markdown(record), "Fix options")
    assert "one-sided p = 0.0089 vs baseline" in line and "0.018" not in line


def test_fix_options_without_speed_and_without_arms() -> None:
    record = _diagnosed()
    del record["evidence"][1]["payload"]["speed_tok_s"]
    (line,) = _section(retro_markdown(record), "Fix options")
    assert "decode speed not measured" in line
    record["evidence"] = [e for e in record["evidence"] if e["payload"]["arm"] == "baseline"]
    assert _section(retro_markdown(record), "Fix options") == [
        "*No probe arm on record removed the failure.*"
    ]
    record["evidence"] = []
    assert "## Fix options" not in retro_markdown(record)


def _with_exchange(exchange: dict[str, Any]) -> dict[str, Any]:
    record = _diagnosed()
    record["evidence"].insert(
        0,
        {
            "id": "E9",
            "kind": "exchange",
            "summary": "failing exchange",
            "source": "capture.json",
            "recorded_at": AT,
            "payload": {"exchange": exchange},
        },
    )
    return record


def test_the_clients_error_text_is_quoted_and_cited() -> None:
    error = {
        "status": 500,
        "response": {"error": {"code": 500, "message": "Failed to parse input at pos 12"}},
    }
    (line,) = _section(retro_markdown(_with_exchange(error)), "Client's error")
    assert line == "- HTTP 500; error `Failed to parse input at pos 12`. \\[[E9](#e9)\\]"
    empty = {"response": {"choices": [{"finish_reason": "length", "message": {"content": ""}}]}}
    (line,) = _section(retro_markdown(_with_exchange(empty)), "Client's error")
    assert line == "- finish_reason `length`; the reply's content was empty. \\[[E9](#e9)\\]"
    long_reply = {"response": {"choices": [{"message": {"content": "word " * 100}}]}}
    (line,) = _section(retro_markdown(_with_exchange(long_reply)), "Client's error")
    assert "(500 chars)" in line and "...`." in line and len(line) < 300
    timeline = _section(retro_markdown(_with_exchange(error)), "Timeline")
    assert timeline[0].startswith("- **2026-07-01 10:00 UTC**: Captured a failing exchange from ")
