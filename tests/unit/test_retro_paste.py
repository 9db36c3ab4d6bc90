"""Issue 28 items 7 and 9: a retrospective that pastes cleanly into Slack, Jira and GitHub
(one citation per claim, no `\\_` in plain words, no anchors in the plain formats, the
client named, "ruled out" only for causes a test ruled out), the live numbers from one
source (the Live card, the retro and the export agree, each with its as-of time), and the
export of a live incident under 20 KB."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from live_records import budget, ok
from sqlmodel import select

from kb.domain import retrotext
from kb.domain.retro import retro_markdown
from kb.domain.retroformat import retro_text
from kb.models import Evidence
from kb.repo import liveincidents
from kb.repo.fileparse import parse_file
from kb.repo.files import export_incident, import_paths, load_record
from kb.repo.store import Store
from triage.cli import cli
from triage.proxy import Recorder

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"
SYSTEM = "You are the coding assistant of the ACME monorepo; follow its style guide. " * 40


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    store = Store("sqlite://")
    try:
        import_paths(store, [INCIDENTS])
        with store.session(readonly=True) as session:
            return load_record(session, REFERENCE)
    finally:
        store.close()


def _section(text: str, title: str) -> str:
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert match, title
    return match.group(1)


# --------------------------------------------------------------------------- paste formats


def test_a_rationale_cites_once_per_claim_not_after_every_sentence(
    reference: dict[str, Any],
) -> None:
    markdown = retro_markdown(reference)
    # The recorded "Heavy use only. ... never measured." draws on E4 alone: one citation.
    line = next(x for x in markdown.splitlines() if "Heavy use only." in x)
    tail = line[line.index("Heavy use only.") :]
    assert tail.count("[E4]") == 1, tail
    for text in markdown.splitlines():
        groups = re.findall(r"\\\[(?:\[[^\]]+\]\(#[\w-]+\)(?:, )?)+\\\]", text)
        assert all(a != b for a, b in zip(groups, groups[1:], strict=False)), text


def test_underscores_in_plain_words_are_not_escaped(reference: dict[str, Any]) -> None:
    for fmt in ("markdown", "plain", "slack"):
        text = retro_text(reference, fmt)
        assert "reasoning_len=2797" in text and "finish_reason=length" in text
        assert "\\_" not in text, fmt


def test_plain_and_slack_formats_have_no_anchors_and_plain_citations(
    reference: dict[str, Any],
) -> None:
    markdown = retro_text(reference, "markdown")
    assert "](#e9)" in markdown  # the markdown format links its citations
    for fmt in ("plain", "slack"):
        text = retro_text(reference, fmt)
        assert "](#" not in text and "\\[" not in text, fmt
        assert "[E9, E10, E11]" in text
        assert "### E9" not in text and "#### E9" not in text
        evidence = re.search(r"E9\*{1,2} \(measurement, 2026-06-10", text)
        assert evidence, fmt  # the evidence list names each id once, as a list item
    slack = retro_text(reference, "slack")
    assert "**" not in slack and "\\" not in slack
    assert not re.search(r"^#", slack, re.M)  # Slack shows '#' headings as text
    assert "*Summary*" in slack and "- *Cause:* Thinking is on by default" in slack
    with pytest.raises(ValueError, match="unknown retrospective format"):
        retro_text(reference, "jira")


def test_ruled_out_lists_only_causes_a_test_ruled_out(reference: dict[str, Any]) -> None:
    record = copy.deepcopy(reference)
    record["causes"].append(
        {
            "id": "reasoning-leak",
            "title": "Thought markup leaks into content",
            "status": "rejected",
            "basis": "measured",
            "deciding_probe": "baseline",
            "rationale": "none of the failing baseline replies has thought markup in content",
            "evidence": [{"id": "E9", "relation": "refutes"}],
        }
    )
    summary = _section(retro_markdown(record), "Summary")
    ruled_out = next(line for line in summary.splitlines() if "**Ruled out:**" in line)
    assert "QAT Q4 weights" in ruled_out  # refuted by its A/B test
    assert "Thought markup" not in ruled_out  # nothing was tested: it did not apply
    assert "**Did not apply:** Thought markup leaks into content." in summary


def test_the_client_is_named(reference: dict[str, Any]) -> None:
    record = copy.deepcopy(reference)
    exchange = {
        "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "request_headers": {"User-Agent": "cline/3.1", "authorization": "[REDACTED]"},
        "status": 200,
        "response": {"choices": [{"finish_reason": "length", "message": {"content": ""}}]},
    }
    record["evidence"].append(
        {
            "id": "E99",
            "kind": "exchange",
            "summary": "captured failing exchange",
            "recorded_at": "2026-06-10T12:00:00Z",
            "payload": {"exchange": exchange},
        }
    )
    errors = _section(retro_markdown(record), "Client's error")
    assert "`cline/3.1` got HTTP 200" in errors


# --------------------------------------------------------------------------- live numbers


def _live_incident(tmp_path: Path, n: int = 48) -> tuple[str, str]:
    """An intermittent live failure over 8 minutes with a long system prompt, recorded
    through the proxy's recorder in batches. Returns (database URL, incident slug)."""
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    recorder = Recorder(
        url, spool_path=tmp_path / "spool.jsonl", replica="proxy-a", flush_seconds=0.01
    )
    recorder.start()
    start = time.time() - 8 * 60
    try:
        for i in range(n):
            at = start + i * 10
            record = budget(f"e{i:03d}", at, content="") if i % 3 == 0 else ok(f"o{i:03d}", at)
            body = json.loads(record["request_body"])
            body["messages"].insert(0, {"role": "system", "content": SYSTEM})
            body["max_tokens"] = 256
            record["request_body"] = json.dumps(body).encode()
            record["client"] = "acme-agent/2.3"
            recorder.submit(record)
            if i % 8 == 7:
                recorder.flush(i + 1)
        recorder.flush(n)
    finally:
        recorder.stop()
    (opened,) = recorder.opened
    return url, str(opened["slug"])


def test_the_live_card_the_retro_and_the_export_give_one_count_with_its_time(
    tmp_path: Path,
) -> None:
    url, slug = _live_incident(tmp_path)
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            (card,) = liveincidents.live_incidents(session)
            record = load_record(session, slug)
        path = export_incident(store, slug, tmp_path / "export")
    finally:
        store.close()
    rate = card.detection["rate"]
    count = retrotext.failing_text(card.detection)
    assert count.startswith(f"{rate['failures']}/{rate['n']} failing") and " UTC" in count
    assert rate["n"] >= 40  # the latest count, not the one at opening
    # The title carries no count that would go stale.
    assert not re.search(r"\d+/\d+", record["title"])
    markdown = retro_markdown(record)
    assert count.replace("_", "\\_") in markdown or count in markdown
    assert count in retro_text(record, "plain")
    # The exported symptoms hold the same numbers, with their time.
    exported = path.read_text("utf-8")
    assert f"failures: {rate['failures']}\n" in exported and f"n: {rate['n']}\n" in exported
    assert "as_of:" in exported
    # The failing exchanges are evidence of the symptoms: nothing "(no evidence recorded)".
    summary = _section(markdown, "Summary")
    assert "no evidence recorded" not in summary
    errors = _section(markdown, "Client's error")
    assert "`acme-agent/2.3` got HTTP 200, finish_reason `length`" in errors
    assert "\\_" not in markdown


def test_captures_before_and_after_the_opening_are_not_one_entry(tmp_path: Path) -> None:
    url, slug = _live_incident(tmp_path)
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            record = load_record(session, slug)
    finally:
        store.close()
    # Move the opening to the middle of the captured exchanges (the recorder ran after).
    times = sorted(e["recorded_at"] for e in record["evidence"])
    record["timeline"][0]["at"] = times[len(times) // 2]
    timeline = _section(retro_markdown(record), "Timeline")
    captured = [line for line in timeline.splitlines() if "Captured" in line]
    assert len(captured) == 2, timeline
    opened = next(i for i, line in enumerate(timeline.splitlines()) if "opened by" in line)
    lines = timeline.splitlines()
    assert "Captured" in lines[opened - 1] and "Captured" in lines[opened + 1]
    # A stretch of captures says when it started and ended.
    assert re.search(r"\*\*\d{4}-\d\d-\d\d \d\d:\d\d UTC to \d{4}-", captured[0] + captured[1])


def test_the_export_of_a_live_incident_is_small(tmp_path: Path) -> None:
    url, slug = _live_incident(tmp_path, n=96)
    store = Store(url, migrate=False)
    try:
        path = export_incident(store, slug, tmp_path / "export")
        with store.session(readonly=True) as session:
            evidence = list(session.exec(select(Evidence)).all())
    finally:
        store.close()
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob("*.jsonl*"))
    assert size < 20_000, size
    whole = [e for e in evidence if "exchange" in e.payload]
    assert len(whole) == 1  # one whole example; the others refer to theirs by live key
    assert all(e.payload.get("live_key") for e in evidence)
    (exported,) = [e for e in parse_file(path)["evidence"] if "exchange" in e["payload"]]
    assert exported["payload"]["exchange"]["request"]["messages"][0]["content"] == SYSTEM


def test_triage_retro_format_slack(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        import_paths(store, [INCIDENTS])
    finally:
        store.close()
    runner = CliRunner()
    result = runner.invoke(cli, ["--database", url, "retro", REFERENCE, "--format", "slack"])
    assert result.exit_code == 0, result.output
    assert "*Summary*" in result.output and "](#" not in result.output
    bad = runner.invoke(cli, ["--database", url, "retro", REFERENCE, "--format", "rtf"])
    assert bad.exit_code != 0 and "rtf" in bad.output
