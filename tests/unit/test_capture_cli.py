"""`triage capture` and `triage check` through click's CliRunner, and the secret canary."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import sqlite3
from datetime import date
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlmodel import select

from kb.models import Evidence, Incident
from kb.repo.store import Store
from triage.cli import cli
from triage.symptoms import KINDS as FINDING_KINDS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
REAL = FIXTURES / "real"
SLUG = "2026-06-10-gemma4-empty-response"


@pytest.fixture()
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite knowledge base file, named by TRIAGE_DATABASE_URL."""
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path / "home"))
    return url


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def evidence_rows(url: str) -> list[Evidence]:
    store = Store(url)
    try:
        with store.session(readonly=True) as session:
            return list(session.exec(select(Evidence).order_by(Evidence.id)).all())
    finally:
        store.close()


def add_incident(url: str, slug: str = SLUG) -> None:
    store = Store(url)
    try:
        with store.session() as session:
            session.add(
                Incident(slug=slug, title="Gemma 4 empty responses", opened_on=date(2026, 6, 10))
            )
    finally:
        store.close()


# ---------------------------------------------------------------------------- check


def test_check_prints_findings_per_exchange(db):
    result = run("check", FIXTURES / "exchanges.jsonl", FIXTURES / "stream-peg-error.sse")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("exchanges.jsonl#0 (line 1) [jsonl] HTTP 200  ok: no symptoms")
    assert any(
        line.startswith("exchanges.jsonl#2 (line 3)") and "parse-failure" in line for line in lines
    )
    assert any("stream-peg-error.sse#0" in line and "http-error" in line for line in lines)
    assert "  x parse-failure" in result.stdout
    assert not Path(db.split("///", 1)[1]).exists()  # check never opens the store


def test_check_json(db):
    result = run("check", FIXTURES / "tool-args-schema-violation.json", "--json")
    assert result.exit_code == 0
    [item] = json.loads(result.stdout)
    assert item["file"] == "tool-args-schema-violation.json"
    assert item["format"] == "pair"
    assert item["symptoms"] == ["tool-args-schema-violation"]
    [violation] = [f for f in item["findings"] if not f["passed"]]
    assert (
        violation["where"]
        == "$.response.choices[0].message.tool_calls[0].function.arguments.max_lines"
    )
    # one per built-in check (server-crash, server-hang and every issue-13 kind too)
    assert len(item["findings"]) == len(FINDING_KINDS)


@pytest.mark.parametrize(
    "args",
    [
        # a request FILE followed by its response FILE
        [REAL / "budget-greedy.request.json", REAL / "budget-greedy.response.json"],
        # --request / --response without FILE
        [
            "--request",
            REAL / "budget-greedy.request.json",
            "--response",
            REAL / "budget-greedy.response.json",
        ],
        # a request FILE with --response
        [REAL / "budget-greedy.request.json", "--response", REAL / "budget-greedy.response.json"],
        # an SSE transcript with --request
        [
            REAL / "budget-greedy-120.response.sse",
            "--request",
            REAL / "budget-greedy-120.request.json",
        ],
        # a request FILE followed by an SSE transcript
        [REAL / "budget-greedy-120.request.json", REAL / "budget-greedy-120.response.sse"],
        # forced format
        [
            "--format",
            "pair",
            REAL / "budget-greedy.request.json",
            REAL / "budget-greedy.response.json",
        ],
    ],
)
def test_check_pair_forms(db, args):
    result = run("check", "--json", *args)
    assert result.exit_code == 0, result.output
    [item] = json.loads(result.stdout)
    assert {"empty-content", "length-stop", "reasoning-exhausted-budget"} <= set(item["symptoms"])
    budget = next(f for f in item["findings"] if f["kind"] == "reasoning-exhausted-budget")
    assert budget["reason"].startswith("max_tokens ")  # the request was paired in


def test_check_curl_with_response(db):
    result = run(
        "check",
        "--format",
        "curl",
        FIXTURES / "peg-gemma4-500.curl",
        "--response",
        FIXTURES / "peg-gemma4-500.response.txt",
    )
    assert result.exit_code == 0, result.output
    assert "HTTP 500" in result.stdout and "parse-failure" in result.stdout


def test_check_names_the_structured_output_refusal_and_leaked_thought(
    db: str, tmp_path: Path
) -> None:
    refused = {
        "request": {
            "messages": [{"role": "user", "content": "City as JSON?"}],
            "response_format": {"type": "json_object"},
        },
        "status": 500,
        "response": {
            "error": {
                "code": 500,
                "message": "The model produced output that does not match the expected "
                "peg-gemma4 format",
                "type": "server_error",
            }
        },
    }
    leaked = {
        "request": {"messages": [{"role": "user", "content": "Capital of France?"}]},
        "response": {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "<|channel>thought\nParis.<channel|>Paris.",
                    },
                    "finish_reason": "stop",
                }
            ]
        },
    }
    (tmp_path / "refused.json").write_text(json.dumps(refused))
    (tmp_path / "leaked.json").write_text(json.dumps(leaked))
    result = run("check", tmp_path / "refused.json", tmp_path / "leaked.json", "--json")
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.stdout)
    assert "structured-output-failed" in first["symptoms"]
    assert "parse-failure" in first["symptoms"]
    assert second["symptoms"] == ["reasoning-markup-in-content"]
    [finding] = [f for f in second["findings"] if not f["passed"]]
    assert finding["where"] == "$.response.choices[0].message.content"
    failing = run("check", tmp_path / "leaked.json", "--fail-on", "reasoning-markup-in-content")
    assert failing.exit_code == 3


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["no-chat.har"],
            "no-chat.har: $.log.entries: HAR has no POST .../chat/completions entries",
        ),
        (["peg-gemma4-500.request.json"], "give its response"),
        (["missing.json"], "missing.json: cannot open"),
    ],
)
def test_check_errors_exit_1_with_the_place(db, args, fragment):
    result = run("check", *[FIXTURES / a for a in args])
    assert result.exit_code == 1  # the one scheme: "Error: ..." and 1 (usage errors 2)
    assert result.stderr.startswith("Error: ") and fragment in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_check_error_names_the_line(db, tmp_path):
    bad = tmp_path / "log.jsonl"
    good = (FIXTURES / "exchanges.jsonl").read_text().splitlines()[0]
    bad.write_text(good + "\n" + good + "\n{not json\n")
    result = run("check", bad)
    assert result.exit_code == 1
    assert f"{bad}:3: invalid JSON line" in result.stderr


def test_usage_errors(db):
    assert run("check").exit_code == 2
    assert run("check", "--request", REAL / "budget-greedy.request.json").exit_code == 2
    unused = run(
        "check", FIXTURES / "exchanges.jsonl", "--response", REAL / "budget-greedy.response.json"
    )
    assert unused.exit_code == 2 and "was not used" in unused.stderr
    assert run("check", "--format", "xml", FIXTURES / "exchanges.jsonl").exit_code == 2


def test_help_lists_the_commands(db):
    result = run("--help")
    assert "capture" in result.stdout and "check" in result.stdout
    assert "--incident" in run("capture", "--help").stdout


# ---------------------------------------------------------------------------- capture


def test_capture_stores_every_exchange_as_evidence(db):
    result = run("capture", FIXTURES / "agent-session.har", FIXTURES / "exchanges.jsonl", "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    assert [i["evidence"] for i in items] == [f"E{n}" for n in range(1, 10)]
    rows = evidence_rows(db)
    assert len(rows) == 9
    first = rows[0]
    assert first.kind == "exchange" and first.incident_id is None
    assert first.source == "har:agent-session.har:$.log.entries[1]"
    assert "empty-content" in first.summary
    assert first.payload["exchange"]["source_format"] == "har"
    assert first.payload["symptoms"] == [
        "empty-content",
        "length-stop",
        "reasoning-exhausted-budget",
        "runaway-reasoning",
    ]
    assert len(first.payload["findings"]) == len(FINDING_KINDS)  # one per check


def test_capture_attaches_to_an_incident(db):
    add_incident(db)
    result = run("capture", "--incident", SLUG, FIXTURES / "stream-peg-error.sse")
    assert result.exit_code == 0, result.output
    assert f"stored 1 exchange(s) on incident {SLUG}" in result.stdout
    [row] = evidence_rows(db)
    assert row.incident_id is not None and row.key == "E1"


def test_capture_is_all_or_nothing(db, tmp_path):
    bad = tmp_path / "bad.sse"
    bad.write_text("data: {broken\n\ndata: [DONE]\n\n")
    result = run("capture", FIXTURES / "exchanges.jsonl", bad)
    assert result.exit_code == 1
    assert f"{bad}:1: SSE data is not JSON" in result.stderr
    assert evidence_rows(db) == []


def test_capture_unknown_incident_stores_nothing(db):
    result = run("capture", "--incident", "no-such-incident", FIXTURES / "exchanges.jsonl")
    assert result.exit_code == 1
    assert "no incident with slug 'no-such-incident'" in result.stderr
    assert evidence_rows(db) == []


# ---------------------------------------------------------------------------- canary

CANARY = "sk-canary-1234567890abcdefghij"
CANARY_FRAGMENTS = (CANARY, "canary-1234567890", "1234567890abcdefghij")


def write_canary_captures(folder: Path) -> list[Path]:
    """Captures of every format whose headers, URL and bodies carry the canary secret."""
    folder.mkdir()
    request = {
        "model": "gemma-4",
        "api_key": CANARY,
        "messages": [
            {"role": "system", "content": f"Authorization: Bearer {CANARY}"},
            {"role": "user", "content": f"my key is {CANARY}, keep it safe"},
        ],
        "extra_body": {"provider": {"password": CANARY, "token": CANARY}},
        "max_tokens": 800,
    }
    response = (REAL / "budget-greedy.response.json").read_text()
    (folder / "body.json").write_text(json.dumps(request))
    (folder / "canary.curl").write_text(
        f"curl 'http://gpu-box:8080/v1/chat/completions?api_key={CANARY}' \\\n"
        f"  -H 'Authorization: Bearer {CANARY}' -H 'x-api-key: {CANARY}' \\\n"
        f"  -H 'Cookie: session={CANARY}' -u 'alice:{CANARY}' \\\n"
        "  -d @body.json\n"
    )
    (folder / "canary.response.txt").write_text(
        f"HTTP/1.1 200 OK\r\nSet-Cookie: session={CANARY}\r\nContent-Type: application/json\r\n\r\n"
        + response
    )
    har = json.loads((FIXTURES / "agent-session.har").read_text())
    for entry in har["log"]["entries"]:
        entry["request"]["headers"].append({"name": "Authorization", "value": f"Bearer {CANARY}"})
        entry["request"]["url"] += f"{'&' if '?' in entry['request']['url'] else '?'}key={CANARY}"
        if "postData" in entry["request"]:
            body = json.loads(entry["request"]["postData"]["text"])
            body["api_key"] = CANARY
            entry["request"]["postData"]["text"] = json.dumps(body)
    (folder / "canary.har").write_text(json.dumps(har))
    line = {
        "request": request,
        "response": json.loads(response),
        "status": 200,
        "request_headers": {"Authorization": f"Bearer {CANARY}", "X-Api-Key": CANARY},
        "url": f"http://gpu-box:8080/v1/chat/completions?token={CANARY}",
    }
    (folder / "canary.jsonl").write_text(json.dumps(line) + "\n")
    return [folder / "canary.curl", folder / "canary.har", folder / "canary.jsonl"]


def assert_no_canary(data: bytes, where: str) -> None:
    variants = [f.encode() for f in CANARY_FRAGMENTS]
    variants.append(base64.b64encode(f"alice:{CANARY}".encode()))
    variants += [f.encode("utf-16-le") for f in CANARY_FRAGMENTS]
    for variant in variants:
        assert variant not in data, f"secret {variant!r} found in {where}"


def test_canary_secret_never_reaches_the_database_output_logs_or_exports(tmp_path, db, caplog):
    caplog.set_level(logging.DEBUG)
    add_incident(db)
    files = write_canary_captures(tmp_path / "captures")
    outputs = []
    for args in (
        ["check", *files[1:]],
        ["check", "--json", files[0], "--response", tmp_path / "captures" / "canary.response.txt"],
        [
            "capture",
            "--incident",
            SLUG,
            files[0],
            "--response",
            tmp_path / "captures" / "canary.response.txt",
            *files[1:],
        ],
        ["capture", "--json", *files[1:]],
    ):
        result = run(*args)
        assert result.exit_code == 0, result.output
        outputs.append(result.output.encode())
    # a failing capture must not echo the secret either
    broken = tmp_path / "captures" / "broken.jsonl"
    broken.write_text(
        json.dumps({"request": {"api_key": CANARY}, "response": f"{CANARY} oops"}) + "\n"
    )
    failed = run("capture", broken)
    assert failed.exit_code == 1
    outputs.append(failed.output.encode())
    for n, output in enumerate(outputs):
        assert_no_canary(output, f"CLI output #{n}")
    assert_no_canary(caplog.text.encode(), "logs")

    rows = evidence_rows(db)
    assert len(rows) == 1 + 3 + 1 + 3 + 1  # curl, har (3), jsonl; then har (3), jsonl
    assert all("[REDACTED:hmac:" in json.dumps(row.payload) for row in rows)

    db_path = Path(db.split("///", 1)[1])
    for path in sorted(db_path.parent.glob("kb.db*")):
        assert_no_canary(path.read_bytes(), path.name)
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert_no_canary(db_path.read_bytes(), "kb.db after checkpoint")
    dump = "\n".join(sqlite3.connect(db_path).iterdump())
    assert_no_canary(dump.encode(), "SQL dump")

    exported = tmp_path / "export"
    try:
        from kb.repo.files import export_all
    except ImportError:  # pragma: no cover - kb.repo.files is another engineer's module
        return
    store = Store(db)
    try:
        paths = export_all(store, exported)
    finally:
        store.close()
    assert paths
    texts = [path.read_bytes() for path in exported.rglob("*") if path.is_file()]
    for n, text in enumerate(texts):
        assert_no_canary(text, f"exported file #{n}")
    # the exported incident does carry the captured exchange, redacted
    assert any(b"[REDACTED:hmac:" in text for text in texts)
    shutil.rmtree(exported)


# ---------------------------------------------------------------------------- dedupe, orphans


def run_on(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--database", url, *map(str, args)], catch_exceptions=False)


def test_capturing_the_same_file_twice_adds_nothing_and_says_so(db_url, tmp_path):
    har = FIXTURES / "agent-session.har"
    first = run_on(db_url, "capture", har)
    assert first.exit_code == 0, first.output
    stored = len(evidence_rows(db_url))
    assert stored > 1 and "stored 0" not in first.stdout
    again = run_on(db_url, "capture", har)
    assert again.exit_code == 0, again.output
    assert "stored 0 exchange(s)" in again.stdout
    assert f"{stored} exchange(s) not stored again: same content as E1" in again.stdout
    assert "(already stored)" in again.stdout
    # The same content under another name (a copy) is the same exchange too.
    copy = tmp_path / "copy-of-session.har"
    shutil.copy(har, copy)
    renamed = run_on(db_url, "capture", copy, "--json")
    assert all(item["duplicate"] for item in json.loads(renamed.stdout))
    assert len(evidence_rows(db_url)) == stored


def test_dedupe_is_per_incident_and_within_one_capture(db_url):
    add_incident(db_url)
    sse = FIXTURES / "stream-peg-error.sse"
    both = run_on(db_url, "capture", "--incident", SLUG, sse, sse)  # the same file twice
    assert both.exit_code == 0, both.output
    assert "stored 1 exchange(s) on incident" in both.stdout
    assert "1 exchange(s) not stored again: same content as E1" in both.stdout
    orphan = run_on(db_url, "capture", sse)  # no incident: its own key space
    assert "stored 1 exchange(s)\n" in orphan.stdout
    assert "triage capture --orphans" in orphan.stdout
    assert [r.incident_id is None for r in evidence_rows(db_url)] == [False, True]


def test_orphans_are_listed_and_attached_renumbered(db_url):
    add_incident(db_url)
    sse = FIXTURES / "stream-peg-error.sse"
    assert run_on(db_url, "capture", "--incident", SLUG, sse).exit_code == 0  # E1 there
    run_on(db_url, "capture", FIXTURES / "tool-args-invalid-json.json")  # orphan E1
    run_on(db_url, "capture", FIXTURES / "tool-args-schema-violation.json")  # orphan E2
    run_on(db_url, "capture", sse)  # orphan E3: same content as the incident's E1

    listed = run_on(db_url, "capture", "--orphans")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("E1 ") and "tool-args-invalid-json.json" in lines[0]
    assert "3 piece(s) of evidence attached to no incident" in listed.stdout
    orphans = json.loads(run_on(db_url, "capture", "--orphans", "--json").stdout)
    assert [o["evidence"] for o in orphans] == ["E1", "E2", "E3"]
    # `incidents list` points at them (on stderr: the listing stays one incident per line)
    listing = run_on(db_url, "incidents", "list")
    assert "3 captured exchange(s) attached to no incident" in listing.stderr
    assert "triage capture --orphans" in listing.stderr and "attached" not in listing.stdout
    assert all(o["kind"] == "exchange" and o["summary"] for o in orphans)

    # An unknown id refuses the whole attach; nothing moves.
    bad = run_on(db_url, "capture", "--attach", "E2", "--attach", "E99", "--incident", SLUG)
    assert bad.exit_code == 1 and "E99" in bad.stderr
    assert sum(r.incident_id is None for r in evidence_rows(db_url)) == 3

    one = run_on(db_url, "capture", "--attach", "E2", "--incident", SLUG)
    assert one.exit_code == 0, one.output
    assert "E2 -> E2\nattached 1 piece(s) of evidence" in one.stdout

    rest = json.loads(
        run_on(db_url, "capture", "--attach", "all", "--incident", SLUG, "--json").stdout
    )
    assert [(r["orphan"], r["evidence"], r["duplicate"]) for r in rest] == [
        ("E1", "E3", False),
        ("E3", "E1", True),  # the incident already holds this exchange
    ]
    assert run_on(db_url, "capture", "--orphans").stdout == "no evidence without an incident\n"
    assert "attached to no incident" not in run_on(db_url, "incidents", "list").stderr
    rows = evidence_rows(db_url)
    assert len(rows) == 3 and all(r.incident_id is not None for r in rows)
    assert sorted(r.key for r in rows) == ["E1", "E2", "E3"]
    shown = run_on(db_url, "incidents", "show", SLUG, "--json")
    assert shown.exit_code == 0 and "tool-args-invalid-json.json" in shown.stdout


def test_orphan_options_usage_errors(db):
    assert run("capture", "--attach", "E1").exit_code == 2  # needs --incident
    assert run("capture", "--orphans", FIXTURES / "exchanges.jsonl").exit_code == 2
    assert run("capture").exit_code == 2
