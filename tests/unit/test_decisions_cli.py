"""`triage decide | parked | revisit | retro` through the real click group, on SQLite and
PostgreSQL; the clock comes from TRIAGE_TODAY. Revisit's server runs are replaced by a
stand-in `replay_rate` here, handed to the CLI through its context object (the real server
is in tests/integration/test_revisit.py)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kb.models import Cause, Incident
from kb.repo.decisions import record_decision
from kb.repo.files import load_record
from kb.repo.store import Store, add_evidence
from triage.cli import cli

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"


@pytest.fixture
def triage(db_url: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Run `triage --database DB ...`; the reference incidents are imported first."""
    runner = CliRunner()

    def run(*args: str, today: str | None = None) -> Result:
        if today is None:
            monkeypatch.delenv("TRIAGE_TODAY", raising=False)
        else:
            monkeypatch.setenv("TRIAGE_TODAY", today)
        # The revisit's replayer, when a test supplies one (see _fake_replay).
        obj = {"replay_rate": run.replay_rate} if run.replay_rate is not None else None
        return runner.invoke(cli, ["--database", db_url, *args], obj=obj, catch_exceptions=False)

    run.replay_rate = None  # type: ignore[attr-defined]

    imported = run("import", str(INCIDENTS))
    assert imported.exit_code == 0, imported.output
    return run


def _record(db_url: str, slug: str = REFERENCE) -> dict[str, Any]:
    store = Store(db_url)
    try:
        with store.session(readonly=True) as session:
            return load_record(session, slug)
    finally:
        store.close()


# --------------------------------------------------------------------------- parked


def test_parked_due_lists_the_reference_once_its_revisit_date_passed(triage) -> None:  # type: ignore[no-untyped-def]
    before = triage("parked", "--due", today="2026-09-09")
    assert before.exit_code == 0
    assert before.output.strip() == "no parked incidents are due as of 2026-09-09"

    listed = triage("parked", today="2026-09-09")
    assert f"{REFERENCE}  WAITING  parked 2026-06-10 by operator" in listed.output
    assert "revisit date 2026-09-10 is in 1 day(s)" in listed.output

    due = triage("parked", "--due", today="2026-09-12")
    assert due.exit_code == 0
    assert f"{REFERENCE}  OVERDUE (2 day(s))" in due.output
    assert "due because: revisit date 2026-09-10 passed 2 day(s) ago" in due.output
    assert "35% decode speed" in due.output

    data = json.loads(triage("parked", "--due", "--json", today="2026-09-12").output)
    assert data["today"] == "2026-09-12"
    [item] = data["parked"]
    assert item["slug"] == REFERENCE and item["due"] is True and item["state"] == "overdue"
    assert item["revisit_on"] == "2026-09-10"
    assert [t["trigger"]["kind"] for t in item["triggers"]] == [
        "date",
        "new-build",
        "new-weights",
        "failure-rate",
    ]


def test_a_bad_clock_is_a_clear_error(triage) -> None:  # type: ignore[no-untyped-def]
    result = triage("parked", today="next tuesday")
    assert result.exit_code == 1
    assert "TRIAGE_TODAY='next tuesday' is not a date" in result.output
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- decide


def test_fixed_is_refused_without_evidence_and_force_labels_it(  # type: ignore[no-untyped-def]
    triage, db_url: str
) -> None:
    refused = triage("decide", REFERENCE, "--fixed", "--fix", "--reasoning off")
    assert refused.exit_code == 1
    assert "refusing FIXED without evidence" in refused.output
    assert "no measured baseline failure rate" in refused.output
    assert "Traceback" not in refused.output
    assert _record(db_url)["status"] == "parked"

    forced = triage(
        "decide",
        REFERENCE,
        "--fixed",
        "--fix",
        "--reasoning off",
        "--force",
        "--by",
        "alice",
        today="2026-09-20",
    )
    assert forced.exit_code == 0, forced.output
    assert "UNVERIFIED" in forced.output
    record = _record(db_url)
    assert record["status"] == "fixed"
    fixed = record["decisions"][-1]
    assert fixed["kind"] == "FIXED" and fixed["verified"] is False and fixed["by"] == "alice"
    assert fixed["at"].startswith("2026-09-20T")
    assert fixed["rationale"].startswith("UNVERIFIED fix")

    reopened = triage("decide", REFERENCE, "--reopened", "--why", "empty responses are back")
    assert reopened.exit_code == 0 and _record(db_url)["status"] == "reopened"


def test_parked_decision_with_date_and_triggers(triage, db_url: str) -> None:  # type: ignore[no-untyped-def]
    slug = "2026-05-01-qwen-echo-response-latency"
    missing = triage("decide", slug, "--parked", "--why", "Qwen is gone")
    assert missing.exit_code == 1
    assert "cannot record PARKED while the incident is closed" in missing.output

    result = triage(
        "decide",
        REFERENCE,
        "--parked",
        "--why",
        "still non-core",
        "--revisit-on",
        "2026-12-01",
        "--when",
        "build>b11434",
        "--when",
        "failure-rate>10%,min=20",
        "--evidence",
        "E21",
        "--json",
        today="2026-09-20",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["revisit_on"] == "2026-12-01" and data["evidence"] == ["E21"]
    assert data["triggers"] == [
        {"kind": "new-build", "after": 11434},
        {"kind": "failure-rate", "threshold": 0.1, "min_captures": 20},
    ]
    assert _record(db_url)["decisions"][-1]["revisit_on"] == "2026-12-01"
    listed = triage("parked", "--due", today="2026-11-30")
    assert listed.output.strip() == "no parked incidents are due as of 2026-11-30"


def test_revisit_on_relative_to_the_clock(triage, db_url: str) -> None:  # type: ignore[no-untyped-def]
    result = triage(
        "decide", REFERENCE, "--parked", "--why", "later", "--revisit-on", "+12w", "--json",
        today="2026-09-20",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["revisit_on"] == "2026-12-13"  # 84 days after the clock
    assert _record(db_url)["decisions"][-1]["revisit_on"] == "2026-12-13"
    for bad in ("+0d", "+99999d", "+3x", "+d"):
        refused = triage("decide", REFERENCE, "--parked", "--why", "x", "--revisit-on", bad)
        assert refused.exit_code == 2, bad
        assert "Traceback" not in refused.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ((REFERENCE,), 2, "say which decision"),
        ((REFERENCE, "--parked", "--why", "x", "--revisit-on", "soon"), 2, "is not a date"),
        ((REFERENCE, "--parked", "--why", "x", "--when", "bogus"), 1, "unknown trigger"),
        ((REFERENCE, "--parked", "--why", "x"), 1, "a way back"),
        ((REFERENCE, "--parked", "--force", "--why", "x"), 2, "--force only applies"),
        (("2026-01-01-nope", "--reopened", "--why", "x"), 1, "no incident with slug"),
        ((REFERENCE, "--reopened", "--why", "x"), 1, "REOPENED applies to incidents"),
    ],
)
def test_decide_errors_are_clear(triage, args: tuple[str, ...], code: int, message: str) -> None:  # type: ignore[no-untyped-def]
    result = triage("decide", *args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_export_writes_the_decision_back_into_the_file(  # type: ignore[no-untyped-def]
    triage, tmp_path: Path
) -> None:
    triage(
        "decide",
        REFERENCE,
        "--parked",
        "--why",
        "still non-core; revisited late",
        "--revisit-on",
        "2026-12-01",
        today="2026-09-20",
    )
    assert triage("export", "--out", str(tmp_path)).exit_code == 0
    text = (tmp_path / f"{REFERENCE}.md").read_text("utf-8")
    assert "rationale: still non-core; revisited late" in text
    assert "revisit_on: 2026-12-01" in text


# --------------------------------------------------------------------------- retro


def test_retro_markdown_html_and_errors(triage, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    markdown = triage("retro", REFERENCE)
    assert markdown.exit_code == 0
    assert markdown.output.startswith("# Retrospective: Gemma 4 on llama-server")
    assert "## Causes" in markdown.output
    out = tmp_path / "retro" / "r.html"
    html = triage("retro", REFERENCE, "--html", "--out", str(out))
    assert html.exit_code == 0 and html.output.strip() == f"wrote {out}"
    page = out.read_text("utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<h3 id="e9">' in page
    missing = triage("retro", "2026-01-01-nope")
    assert missing.exit_code == 1 and "no incident with slug" in missing.output
    assert "Traceback" not in missing.output


# --------------------------------------------------------------------------- revisit


@pytest.fixture
def drill_incident(db_url: str, tmp_path: Path) -> Path:
    """A parked incident with a recorded failing exchange and a baseline of 8/8; returns
    a stack file whose binary reports build 11434."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 11434 (0a1b2c3)'\n")
    binary.chmod(0o755)
    (tmp_path / "drill.gguf").write_bytes(b"GGUF drill stand-in")
    stack = tmp_path / "stack.toml"
    stack.write_text(
        f'[server]\nbinary = "{binary}"\nmodel = "drill.gguf"\nargs = ["-c", "2048"]\n'
    )
    store = Store(db_url)
    t0 = datetime(2026, 7, 1, 12, tzinfo=timezone.utc)
    try:
        with store.session() as session:
            incident = Incident(
                slug="2026-07-01-drill", title="drill", opened_on=t0.date(), server_build="b9586"
            )
            session.add(incident)
            session.flush()
            add_evidence(
                session,
                incident_id=incident.id,
                kind="exchange",
                summary="failing exchange: empty-content",
                payload={
                    "exchange": {
                        "request": {
                            "messages": [{"role": "user", "content": "x"}],
                            "max_tokens": 800,
                            "temperature": 0,
                        }
                    },
                    "findings": [{"kind": "empty-content", "passed": False}],
                },
                recorded_at=t0,
            )
            add_evidence(
                session,
                incident_id=incident.id,
                kind="measurement",
                summary="arm baseline: 8/8",
                payload={"type": "arm", "arm": "baseline", "n": 8, "failures": 8},
                recorded_at=t0,
            )
            session.add(
                Cause(
                    incident_id=incident.id,
                    key="reasoning-exhausts-budget",
                    catalogue_id="reasoning-exhausts-budget",
                    title="reasoning eats the budget",
                    status="confirmed",
                    deciding_probe="thinking-off",
                )
            )
        with store.session() as session:
            record_decision(
                session,
                "2026-07-01-drill",
                "PARKED",
                rationale="drill",
                triggers=["new-build"],
                revisit_on="2026-08-01",
                at=t0,
            )
    finally:
        store.close()
    return stack


def _fake_replay(triage: Any, outcomes: list[tuple[int, int, str]]) -> list:
    """Replace the revisit's server runs with `outcomes` (failures, n, decision) in order."""
    calls: list[dict[str, Any]] = []

    def replay_rate(stack, bodies, *, max_requests, baseline=None, log_dir=None):  # type: ignore[no-untyped-def]
        failures, n, decision = outcomes[len(calls)]
        calls.append(
            {
                "bodies": bodies,
                "baseline": baseline,
                "max_requests": max_requests,
                "model": str(stack.server.model),
            }
        )
        return SimpleNamespace(
            n=n,
            failures=failures,
            rate=failures / n if n else None,
            ci95=[0.0, 0.37],
            p_value=0.0002 if decision == "removes" else 1.0,
            decision=decision,
            error="ServerStartError: llama-server exited with code 1" if not n else "",
        )

    triage.replay_rate = replay_rate
    return calls


def test_revisit_proposes_fixed_with_before_after_rates(  # type: ignore[no-untyped-def]
    triage, db_url: str, drill_incident: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_replay(triage, [(0, 8, "removes")])
    result = triage(
        "revisit",
        "2026-07-01-drill",
        "--stack",
        str(drill_incident),
        "--max-requests",
        "16",
        today="2026-08-02",
    )
    assert result.exit_code == 0, result.output
    assert "propose FIXED" in result.output
    assert "before 8/8 (100%), after 0/8 (0%), p=0.0002" in result.output
    assert calls[0]["baseline"] == (8, 8) and calls[0]["max_requests"] == 16
    assert calls[0]["bodies"][0]["max_tokens"] == 800
    record = _record(db_url, "2026-07-01-drill")
    revisit = record["evidence"][-1]
    assert revisit["payload"]["arm"] == "revisit"
    assert revisit["payload"]["stack"]["build_number"] == 11434
    assert len(revisit["payload"]["stack"]["weights_sha256"]) == 64
    assert revisit["recorded_at"].startswith("2026-08-02T")
    assert record["status"] == "parked"  # proposed, not decided

    # The revisit settled the date and the new build it ran on: no longer due.
    assert "no parked incidents are due" in triage("parked", "--due", today="2026-08-03").output

    # FIXED now passes the evidence rule.
    fixed = triage(
        "decide",
        "2026-07-01-drill",
        "--fixed",
        "--fix",
        "server --reasoning off",
        today="2026-08-03",
    )
    assert fixed.exit_code == 0, fixed.output
    decision = _record(db_url, "2026-07-01-drill")["decisions"][-1]
    assert decision["verified"] is True and decision["evidence"] == ["E2", revisit["id"]]

    # Revisited again once fixed, the failure is back: REOPENED is proposed.
    _fake_replay(triage, [(8, 8, "unchanged"), (0, 8, "removes")])
    back = triage("revisit", "2026-07-01-drill", "--stack", str(drill_incident), today="2026-09-01")
    assert back.exit_code == 0, back.output
    assert "the failure is back (before 8/8 (100%), after 8/8 (100%)" in back.output
    assert "triage decide 2026-07-01-drill --reopened" in back.output
    assert "deciding probe thinking-off: 0/8 (0%) (removes)" in back.output


def test_revisit_keeps_parked_when_unchanged_and_all_due(  # type: ignore[no-untyped-def]
    triage, drill_incident: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_replay(triage, [(8, 8, "unchanged"), (0, 8, "removes")])
    nothing = triage("revisit", "--all-due", "--stack", str(drill_incident), today="2026-07-15")
    assert nothing.exit_code == 0
    assert nothing.output.strip() == "no parked incident is due as of 2026-07-15"
    assert calls == []

    result = triage(
        "revisit", "--all-due", "--stack", str(drill_incident), "--json", today="2026-09-15"
    )
    # The reference incident is due too but has no recorded failing exchange: reported.
    assert result.exit_code == 1
    data = json.loads(result.output)
    by_slug = {r["slug"]: r for r in data["revisits"]}
    assert "no recorded failing exchange" in by_slug[REFERENCE]["message"]
    drill = by_slug["2026-07-01-drill"]
    assert drill["proposal"] == "PARKED"
    assert drill["message"].startswith("stays PARKED: the failure is unchanged")
    assert drill["before"]["failures"] == 8 and drill["after"]["failures"] == 8
    assert drill["probes"] == [
        {"probe": "thinking-off", "failures": 0, "n": 8, "decision": "removes"}
    ]
    # The deciding probe replays the same request with thinking off, against the revisit.
    assert calls[1]["bodies"][0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert calls[1]["baseline"] == (8, 8)


def test_revisit_errors_are_clear(  # type: ignore[no-untyped-def]
    triage, drill_incident: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_replay(triage, [])
    usage = triage("revisit")
    assert usage.exit_code == 2 and "give one SLUG or --all-due" in usage.output
    no_stack = triage("revisit", "2026-07-01-drill")
    assert no_stack.exit_code == 1 and "pass --stack STACK.toml" in no_stack.output
    no_exchange = triage("revisit", REFERENCE, "--stack", str(drill_incident))
    assert no_exchange.exit_code == 1 and "no recorded failing exchange" in no_exchange.output
    bad_stack = drill_incident.with_name("bad.toml")
    bad_stack.write_text("[server]\n")
    bad = triage("revisit", "2026-07-01-drill", "--stack", str(bad_stack))
    assert bad.exit_code == 1 and "bad.toml" in bad.output
    for result in (usage, no_stack, no_exchange, bad):
        assert "Traceback" not in result.output


def test_revisit_that_cannot_start_the_server_fails_clearly(  # type: ignore[no-untyped-def]
    triage, db_url: str, drill_incident: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_replay(triage, [(0, 0, "errored")])
    result = triage("revisit", "2026-07-01-drill", "--stack", str(drill_incident))
    assert result.exit_code == 1
    assert "revisit errored: ServerStartError: llama-server exited with code 1" in result.output
    assert "Traceback" not in result.output
    # Recorded, but not a run that could prove a fix or settle the revisit date.
    refused = triage("decide", "2026-07-01-drill", "--fixed", "--fix", "x")
    assert refused.exit_code == 1 and "no probe run on the current stack" in refused.output
    assert _record(db_url, "2026-07-01-drill")["evidence"][-1]["payload"]["decision"] == "errored"
