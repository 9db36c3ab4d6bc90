"""Revisit against a real llama-server: a parked drill incident is proposed FIXED once the
stack removes its cause (server `--reasoning off`), and stays PARKED on the unchanged stack.

The incident is made the way a person without a full diagnosis would: an incident file
(`triage import`) with the suspected cause, one real failing exchange from the drill's
server (`triage capture`), and the baseline failure rate of that exchange measured with
the engine's sequential replay on the unchanged stack; then `triage decide --parked`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from kb.repo.files import load_record
from kb.repo.store import Store, add_evidence, require_incident
from triage.cli import cli
from triage.drills import build_drill
from triage.stackfile import load_stack

pytestmark = pytest.mark.integration

MAX_REQUESTS = "8"


@pytest.fixture(scope="module")
def server_binary() -> Path:
    from triage.llama.build import find_server_binary

    try:
        return find_server_binary()
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is not built: {exc}")
        pytest.skip(f"llama-server is not built: {exc}")


def _no_leaked_servers() -> None:
    from triage.llama.launcher import running_servers

    assert running_servers() == []


def _failing_exchange(stack_path: Path, request: dict, out: Path) -> tuple[Path, Path]:
    """One real failing reply of the drill's server, saved as a request/response pair."""
    from triage.engine import open_server

    stack = load_stack(stack_path)
    with open_server(stack.server, out / "capture-logs", 60.0) as server:
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=request, timeout=120)
    assert reply.status_code == 200
    body = reply.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"].get("content") in ("", None)
    request_file, response_file = out / "request.json", out / "response.json"
    request_file.write_text(json.dumps(request))
    response_file.write_text(json.dumps(body))
    return request_file, response_file


SLUG = "2026-11-01-drill-thinking-budget"
INCIDENT_FILE = f"""---
slug: {SLUG}
title: 'Drill gemma4-thinking-budget: empty content, finish_reason length'
status: open
opened: 2026-11-01
causes:
  - id: reasoning-exhausts-budget
    title: Thinking is on by default and the reasoning channel eats the token budget
    status: suspected
    basis: untested
    deciding_probe: thinking-off
---
"""


def test_parked_drill_is_proposed_fixed_only_when_the_cause_is_removed(
    server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triage.engine import replay_rate

    monkeypatch.delenv("TRIAGE_TODAY", raising=False)
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    unchanged = drill.out_dir / "stack.toml"
    # The same stack with the seed's first fix candidate applied: thinking off on the server.
    fixed = drill.out_dir / "stack-reasoning-off.toml"
    fixed.write_text(
        unchanged.read_text().replace('args = ["', 'args = ["--reasoning", "off", "', 1)
    )
    assert load_stack(fixed).server.args[:2] == ("--reasoning", "off")
    request = drill.request("greedy")

    db = f"sqlite:///{tmp_path / 'kb.db'}"
    runner = CliRunner()

    def triage(*args: str) -> Result:
        result = runner.invoke(cli, ["--database", db, *args], catch_exceptions=False)
        print(f"$ triage {' '.join(args)}\n{result.output}")
        return result

    try:
        incident_file = tmp_path / "incidents" / f"{SLUG}.md"
        incident_file.parent.mkdir()
        incident_file.write_text(INCIDENT_FILE)
        assert triage("import", str(incident_file)).exit_code == 0
        request_file, response_file = _failing_exchange(unchanged, request, tmp_path)
        captured = triage("capture", str(request_file), str(response_file), "--incident", SLUG)
        assert captured.exit_code == 0, captured.output

        # The incident's baseline: the failing request replayed on the unchanged stack.
        base = replay_rate(
            load_stack(unchanged),
            [request],
            max_requests=int(MAX_REQUESTS),
            log_dir=tmp_path / "baseline-logs",
        )
        assert base.failures == base.n >= 4  # deterministic at temperature 0
        store = Store(db)
        try:
            with store.session() as session:
                add_evidence(
                    session,
                    incident_id=require_incident(session, SLUG).id,
                    kind="measurement",
                    summary=f"arm baseline: {base.failures}/{base.n} failed",
                    payload={
                        "type": "arm",
                        "arm": "baseline",
                        "n": base.n,
                        "failures": base.failures,
                    },
                    source="tests/integration/test_revisit.py",
                )
        finally:
            store.close()

        parked = triage(
            "decide",
            SLUG,
            "--parked",
            "--why",
            "drill: non-core model",
            "--revisit-on",
            "2099-01-01",
            "--when",
            "new-build",
        )
        assert parked.exit_code == 0, parked.output

        # The unchanged stack: the failure is still there, so it stays PARKED.
        same = triage(
            "revisit", SLUG, "--stack", str(unchanged), "--max-requests", MAX_REQUESTS, "--json"
        )
        assert same.exit_code == 0, same.output
        [kept] = json.loads(same.output)["revisits"]
        assert kept["proposal"] == "PARKED", kept
        assert kept["message"].startswith("stays PARKED: the failure is unchanged")
        assert kept["before"]["failures"] == kept["before"]["n"] == base.n
        assert kept["after"]["failures"] == kept["after"]["n"] >= 4
        # The suspected cause's deciding probe removes the failure on this stack.
        assert [(p["probe"], p["decision"]) for p in kept["probes"]] == [
            ("thinking-off", "removes")
        ]

        refused = triage("decide", SLUG, "--fixed", "--fix", "nothing changed")
        assert refused.exit_code == 1 and "not significantly below" in refused.output

        # Thinking off on the server: the failure is gone, FIXED is proposed with the rates.
        gone = triage("revisit", SLUG, "--stack", str(fixed), "--max-requests", MAX_REQUESTS)
        assert gone.exit_code == 0, gone.output
        assert "propose FIXED" in gone.output
        rates = re.search(r"before (\d+)/(\d+) \(100%\), after 0/(\d+) \(0%\), p=", gone.output)
        assert rates is not None, gone.output
        assert int(rates.group(1)) == int(rates.group(2)) == base.n
        assert int(rates.group(3)) >= 4

        # ... and the decision that follows passes the evidence rule.
        decided = triage("decide", SLUG, "--fixed", "--fix", "server --reasoning off")
        assert decided.exit_code == 0, decided.output
        assert "UNVERIFIED" not in decided.output
        retro = triage("retro", SLUG)
        assert retro.exit_code == 0 and "Probe arm revisit" in retro.output
    finally:
        _no_leaked_servers()

    store = Store(db)
    try:
        with store.session(readonly=True) as session:
            record = load_record(session, SLUG)
    finally:
        store.close()
    assert record["status"] == "fixed"
    revisits = [e for e in record["evidence"] if (e.get("payload") or {}).get("arm") == "revisit"]
    assert [r["payload"]["decision"] for r in revisits] == ["unchanged", "removes"]
    assert all(r["payload"]["stack"]["build_number"] for r in revisits)
    fix = record["decisions"][-1]
    assert fix["kind"] == "FIXED" and fix["verified"] is True
    assert revisits[-1]["id"] in fix["evidence"]
