"""The server log as evidence for schema-not-enforced (issue 24): llama-server's grammar lines
(b11434's exact wording) are scanned from a running server's log, bounded and redacted, tied
to the replays in flight when each was written, and read back by the cause's rule -- the
log line in the rationale and the observation cited; "not available" for a server given by
URL; and an arm whose own requests the log shows still failing open never rejects the
cause."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from triage.causes import ArmOutcome, Observations
from triage.engine.causes.schema import CAUSE
from triage.engine.server_log import asks_for_grammar, note_server_logs, replay_window
from triage.engine.servers import Server
from triage.llama import grammar_log
from triage.llama.grammar_log import (
    FACT,
    GrammarLog,
    LineKind,
    arm_evidence,
    classify,
    request_patterns,
    summary_fact,
)
from triage.stackfile import ServerConfig

# As b11434 writes them (measured; common/json-schema-to-grammar.cpp, src/llama-grammar.cpp).
FAILED_OPEN = (
    "WARNING: JSON schema conversion was incomplete: pattern ^\\d{4}-\\d{2}-\\d{2}$ is not "
    "supported (unsupported escape: \\d), accepting any string"
)
UNANCHORED = (
    "WARNING: JSON schema conversion was incomplete: pattern [A-Z]{3} is not supported (not "
    "anchored with '^' and '$'), accepting any string"
)
SCHEMA_REFUSED = (
    '3.43.683.516 W srv    operator(): got exception: {"error":{"code":400,"message":"Unable '
    "to generate parser for this template. Automatic parser generation failed: JSON schema "
    'conversion failed:\\nInvalid pattern ^(a$: unbalanced parentheses"}}'
)
GRAMMAR_REFUSED = "3.43.746.602 E failed to parse grammar"
NOISE = "0.48.444.447 I slot launch_slot_: id  3 | task 0 | processing task, is_child = 0"
DATE = "^\\d{4}-\\d{2}-\\d{2}$"


def _append(path: Path, *lines: str) -> None:
    with path.open("a") as handle:
        handle.write("".join(line + "\n" for line in lines))


def test_the_lines_are_classified_by_what_happened_to_the_request() -> None:
    assert classify(FAILED_OPEN) is LineKind.FAILED_OPEN
    assert classify(UNANCHORED) is LineKind.FAILED_OPEN
    assert classify(SCHEMA_REFUSED) is LineKind.SCHEMA_REFUSED
    assert classify(GRAMMAR_REFUSED) is LineKind.GRAMMAR_REFUSED
    assert classify("parse: error parsing grammar: Undefined rule identifier 'foo'") is (
        LineKind.GRAMMAR_REFUSED
    )
    assert classify(NOISE) is None and classify("srv  update_slots: all slots are idle") is None


def test_a_line_is_tied_to_the_reply_in_flight_when_it_was_written(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "startup", FAILED_OPEN)  # an observation request: no replay in flight
    log = GrammarLog(path)
    window = log.open_window("baseline", 0, frozenset({DATE}))
    _append(path, FAILED_OPEN, NOISE)
    log.close_window(window)
    window = log.open_window("schema-simplified", 0, frozenset({"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}))
    _append(path, NOISE)
    log.close_window(window)
    summary = log.summary()
    base, arm = summary.arm("baseline"), summary.arm("schema-simplified")
    assert base is not None and arm is not None
    assert base.lines == {LineKind.FAILED_OPEN: 1} and base.replies_logged[LineKind.FAILED_OPEN]
    assert arm.lines == {} and arm.replies == 1 and arm.replies_alone == 1
    assert summary.outside == 1 and summary.shared == 0
    assert summary.texts[0].text == FAILED_OPEN and summary.texts[0].count == 2


def test_overlapping_replays_are_told_apart_by_the_pattern_the_line_names(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("")
    log = GrammarLog(path)
    first = log.open_window("baseline", 0, frozenset({DATE}))
    second = log.open_window("schema-simplified", 0, frozenset({"^[0-9]{4}$"}))
    third = log.open_window("anti-repetition", 0, frozenset({DATE}))
    _append(path, FAILED_OPEN)  # named pattern: baseline's and anti-repetition's, not the arm's
    log.close_window(first)
    log.close_window(second)
    log.close_window(third)
    fourth = log.open_window("baseline", 1, frozenset({DATE}))
    other = log.open_window("schema-simplified", 1, frozenset({"^[0-9]{4}$"}))
    _append(path, FAILED_OPEN)  # only the baseline's request carries it
    log.close_window(fourth)
    log.close_window(other)
    summary = log.summary()
    base, arm = summary.arm("baseline"), summary.arm("schema-simplified")
    assert base is not None and arm is not None
    assert summary.shared == 1  # the first line: two arms carry the pattern
    assert base.lines == {LineKind.FAILED_OPEN: 1} and base.replies_logged == {
        LineKind.FAILED_OPEN: 1
    }
    assert arm.lines == {} and arm.replies_alone == 0  # never alone, never logged


def test_the_scan_is_incremental_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "server.log"
    huge = "x" * (grammar_log.PARTIAL_LINE_BYTES * 3)  # a grammar dumped on one line
    _append(path, NOISE, huge + " failed to parse grammar", FAILED_OPEN)
    log = GrammarLog(path)
    while log.scan(limit=1000):  # small chunks: lines split across reads
        pass
    texts = {t.kind: t for t in log.summary().texts}
    assert texts[LineKind.FAILED_OPEN].text == FAILED_OPEN  # offsets kept across the cut
    assert LineKind.GRAMMAR_REFUSED not in texts  # its marker lies past the cut
    long_line = "WARNING: JSON schema conversion was incomplete: " + "p" * 5000
    _append(path, long_line)
    log.scan_all()
    kept = [t for t in log.summary().texts if t.text.startswith("WARNING") and t.count == 1]
    assert len(kept[0].text) <= grammar_log.LINE_CHARS
    monkeypatch.setattr(grammar_log, "MAX_LINES", 3)
    monkeypatch.setattr(grammar_log, "MAX_TEXTS", 2)
    _append(path, UNANCHORED, GRAMMAR_REFUSED, FAILED_OPEN)
    log.scan_all()
    summary = log.summary()
    assert len(summary.texts) == 2
    assert "past the first 3" in summary.not_scanned and "other texts" in summary.not_scanned


def test_a_log_past_the_launchers_limit_says_what_was_not_scanned(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, NOISE, FAILED_OPEN)
    log = GrammarLog(path, limit_bytes=50)
    log.scan_all()
    assert "limit" in log.summary().not_scanned


def test_secrets_in_a_logged_line_are_redacted(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    token = "sk-proj-" + "a1B2c3D4e5" * 4
    _append(
        path,
        f"WARNING: JSON schema conversion was incomplete: pattern {token} is not supported "
        "(x), accepting any string; api key hunter2secret in the pattern",
    )
    log = GrammarLog(path, secrets=["hunter2secret"])
    log.scan_all()
    fact = summary_fact(FACT, "the incident's server", log.summary())
    assert token not in str(fact) and "hunter2secret" not in str(fact)
    assert "accepting any string" in str(fact["summary"])


def test_request_patterns_are_read_everywhere_and_bounded() -> None:
    body = {
        "response_format": {"json_schema": {"schema": {"properties": {"a": {"pattern": "x"}}}}},
        "tools": [{"function": {"parameters": {"properties": {"b": {"pattern": "^y$"}}}}}],
        "messages": [{"role": "user", "content": "pattern"}],
    }
    assert request_patterns(body) == {"x", "^y$"}
    wide = {"anyOf": [{"pattern": str(i)} for i in range(1000)]}
    assert len(request_patterns(wide)) == grammar_log.MAX_PATTERNS


# -- the engine's hook and observation ---------------------------------------------------------
def _server(config: ServerConfig, log_path: Path | None) -> Server:
    handle = SimpleNamespace(log_path=log_path) if log_path is not None else None
    return Server(config.key(), config, "http://127.0.0.1:1", 1, 0.0, handle)


def _execution(request: dict[str, Any], *servers: Server) -> Any:
    stack = SimpleNamespace(server=servers[0].config)
    arms = {"baseline": SimpleNamespace(name="baseline", group=servers[0].key)}
    return SimpleNamespace(
        plan=SimpleNamespace(request=request, stack=stack),
        servers={s.key: s for s in servers},
        arms=arms,
        facts={},
    )


REQUEST = {
    "messages": [{"role": "user", "content": "When? JSON."}],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "d", "schema": {"properties": {"date": {"pattern": DATE}}}},
    },
}


def test_the_replay_hook_opens_a_window_while_the_request_is_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("")
    config = ServerConfig(model=tmp_path / "m.gguf", args=["--api-key", "hunter2secret"])
    server = _server(config, path)

    async def replay() -> None:
        async with replay_window(server, "baseline", 0, REQUEST, contextlib.nullcontext()):
            _append(path, FAILED_OPEN + " hunter2secret")

    asyncio.run(replay())
    execution = _execution(REQUEST, server)
    note_server_logs(execution)
    fact = execution.facts[FACT]
    assert fact["available"] and fact["arms"]["baseline"]["lines"] == {"accepting-any-string": 1}
    assert "hunter2secret" not in str(fact)  # the server's own --api-key value
    evidence = arm_evidence(execution.facts, "baseline")
    assert (
        evidence is not None
        and evidence.failed_open == 1
        and evidence.text.startswith("WARNING: JSON schema conversion was incomplete")
    )


def test_a_server_given_by_url_has_no_log_and_says_so() -> None:
    server = _server(ServerConfig(url="http://127.0.0.1:9"), None)
    execution = _execution(REQUEST, server)
    note_server_logs(execution)
    fact = execution.facts[FACT]
    assert fact["available"] is False and "not available" in fact["summary"]
    plain = _execution({"messages": []}, server)
    note_server_logs(plain)
    assert plain.facts == {}  # no schema, no grammar: nothing to say
    assert asks_for_grammar(REQUEST) and not asks_for_grammar({"messages": []})


# -- the cause's rule -------------------------------------------------------------------------
def _arm(name: str, n: int, failures: int, decision: str, **extra: Any) -> ArmOutcome:
    return ArmOutcome(name, n, failures, decision, p_value=0.001, **extra)


def _fact(baseline: int, simplified: int) -> dict[str, Any]:
    return {
        "name": FACT,
        "available": True,
        "lines": [{"kind": "accepting-any-string", "text": FAILED_OPEN, "count": 8}],
        "arms": {
            "baseline": {
                "replies": 8,
                "lines": {"accepting-any-string": baseline},
                "replies_alone": 8,
                "replies_logged": {"accepting-any-string": baseline},
            },
            "schema-simplified": {
                "replies": 8,
                "lines": {"accepting-any-string": simplified} if simplified else {},
                "replies_alone": 8,
                "replies_logged": {},
            },
        },
        "summary": "...",
    }


def _obs(fact: dict[str, Any]) -> Observations:
    return Observations(planned=("baseline", "schema-simplified"), facts={FACT: fact})


BASE = _arm("baseline", 8, 8, "baseline", kind_counts={"schema-violation": 8})


def test_a_confirmation_quotes_the_log_line_and_cites_the_observation() -> None:
    arms = {"baseline": BASE, "schema-simplified": _arm("schema-simplified", 8, 0, "removes")}
    verdict = CAUSE.decide(arms, _obs(_fact(8, 0)))
    assert verdict.status == "confirmed" and FACT in verdict.supports
    assert "baseline: 8 lines accepting any string" in verdict.rationale
    assert "8 tied to one reply each" in verdict.rationale
    assert "schema-simplified: 0 lines" in verdict.rationale
    assert f'it says: "{FAILED_OPEN}"' in verdict.rationale  # the line itself


def test_an_arm_whose_own_requests_still_fail_open_tested_nothing() -> None:
    arms = {"baseline": BASE, "schema-simplified": _arm("schema-simplified", 8, 8, "unchanged")}
    verdict = CAUSE.decide(arms, _obs(_fact(8, 8)))
    assert verdict.status == "suspected"  # never rejected on an arm that changed nothing
    assert "tested nothing" in verdict.rationale
    without_log = CAUSE.decide(arms, Observations(planned=("baseline", "schema-simplified")))
    assert without_log.status == "rejected"  # no log: the arm's outcome decides as before


def test_a_server_given_by_url_is_said_to_have_no_log_in_the_rationale() -> None:
    arms = {"baseline": BASE, "schema-simplified": _arm("schema-simplified", 8, 0, "removes")}
    fact = {"name": FACT, "available": False, "summary": "server log: not available (URL)"}
    verdict = CAUSE.decide(arms, _obs(fact))
    assert verdict.status == "confirmed" and "not available" in verdict.rationale
    assert FACT not in verdict.supports


def test_an_arm_whose_failures_are_only_cut_at_max_tokens_changed_the_failure() -> None:
    # As measured with `[A-Z]{3}` on SmolLM2: 7/8 baseline failures, 2 of them complete
    # values that violate the pattern; with the pattern enforced, every reply runs to the limit.
    base = _arm("baseline", 8, 7, "baseline", kind_counts={"schema-violation": 7, "length-stop": 5})
    cut = {"schema-violation": 4, "length-stop": 4}
    arms = {
        "baseline": base,
        "schema-simplified": _arm("schema-simplified", 4, 4, "unchanged", kind_counts=cut),
    }
    verdict = CAUSE.decide(arms, _obs(_fact(7, 0)))
    assert verdict.status == "suspected" and "cut at max_tokens" in verdict.rationale
    assert "2 of the baseline's failing replies ended on their own" in verdict.rationale
    # The baseline's failures were all cut too: the arm left them unchanged -- rejected.
    all_cut = _arm(
        "baseline", 8, 7, "baseline", kind_counts={"schema-violation": 7, "length-stop": 7}
    )
    verdict = CAUSE.decide({**arms, "baseline": all_cut}, _obs(_fact(7, 0)))
    assert verdict.status == "rejected"
