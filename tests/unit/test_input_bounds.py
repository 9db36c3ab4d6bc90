"""Input gaps (issue 27): errors name the field, free text is bounded and scrubbed of
secret phrases, special files in a stack file are refused as such."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func
from sqlmodel import select

from kb.domain.errors import StoreError
from kb.models import Cause, CauseStatusChange, Evidence, Incident
from kb.repo.store import Store, open_incident, record_status_change
from triage.cli import cli
from triage.stackfile import StackError, load_stack, parse_stack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--database", url, *args])


def _count(store: Store, model: type) -> int:
    with store.session(readonly=True) as session:
        return int(session.exec(select(func.count()).select_from(model)).one())


def test_a_lone_surrogate_is_named_by_its_json_path(store: Store, tmp_path: Path) -> None:
    record = json.loads((FIXTURES / "exchanges.jsonl").read_text(encoding="utf-8").split("\n")[0])
    record["request"]["messages"][1]["content"] = "PLACEHOLDER"
    bad = tmp_path / "surrogate.json"
    bad.write_text(json.dumps(record).replace("PLACEHOLDER", "abc \\ud800 x"), encoding="utf-8")
    result = _cli(store.url, "capture", str(bad))
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)  # a clean `Error:` line, no traceback
    assert "$.request.messages[1].content: not valid Unicode" in result.output, result.output
    assert _count(store, Evidence) == 0
    good = json.dumps(record).replace("PLACEHOLDER", "fine")
    lines = tmp_path / "surrogate.jsonl"
    lines.write_text(good + "\n" + bad.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    result = _cli(store.url, "capture", str(lines))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "line 2, $.request.messages[1].content: not valid Unicode" in result.output
    stream = tmp_path / "surrogate.sse"
    stream.write_text(
        'data: {"choices":[{"delta":{"content":"a\\ud800b"}}]}\n\ndata: [DONE]\n\n',
        encoding="utf-8",
    )
    result = _cli(store.url, "capture", str(stream))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "$.response.choices[0].message.content: not valid Unicode" in result.output
    assert _count(store, Evidence) == 0
    # Undecodable bytes in an argument arrive as surrogates too: named, not a traceback.
    title = os.fsdecode(b"incident \xed\xa0\x80 title")
    opened = _cli(store.url, "incidents", "new", title)
    assert opened.exit_code == 1 and isinstance(opened.exception, SystemExit)
    assert "title: not valid Unicode" in opened.output
    assert _count(store, Incident) == 0


def test_text_fields_are_bounded_by_name(store: Store, tmp_path: Path) -> None:
    huge = "x" * 5_000_000
    incident = tmp_path / "2026-01-01-big.md"
    incident.write_text(
        f"---\nslug: 2026-01-01-big\ntitle: {huge}\nstatus: open\nopened: 2026-01-01\n---\n",
        encoding="utf-8",
    )
    imported = _cli(store.url, "import", str(incident))
    assert imported.exit_code == 1
    assert str(incident) in imported.output and "title" in imported.output
    assert len(imported.output) < 1_000  # the message does not quote the title
    assert _count(store, Incident) == 0
    with store.session() as session:
        opened = open_incident(session, "Bounded rationale")
        cause = Cause(
            incident_id=opened.id, key="c", catalogue_id="c", title="c", status="suspected"
        )
        session.add(cause)
    with pytest.raises(StoreError, match=r"cause_status_change\.rationale: 50,000 characters"):
        with store.session() as session:
            row = session.exec(select(Cause)).one()
            record_status_change(session, row, "rejected", actor="t", rationale="y" * 50_000)
    assert _count(store, CauseStatusChange) == 0


def test_incident_list_cuts_long_titles(store: Store) -> None:
    title = "A long title " + "word " * 55 + "END"
    with store.session() as session:
        open_incident(session, title)
    listed = _cli(store.url, "incidents", "list")
    assert listed.exit_code == 0
    (line,) = [row for row in listed.output.splitlines() if "A long title" in row]
    assert "END" not in line and line.endswith("...")
    whole = _cli(store.url, "incidents", "list", "--json")
    assert json.loads(whole.output)[0]["title"] == title  # --json keeps it whole


def _stored_text(store: Store) -> str:
    with store.session(readonly=True) as session:
        incidents = session.exec(select(Incident)).all()
        changes = session.exec(select(CauseStatusChange)).all()
    parts = [f"{i.slug} {i.title} {i.summary}" for i in incidents]
    parts += [c.rationale for c in changes]
    return "\n".join(parts)


def test_secret_phrases_in_free_text_are_redacted_without_a_hash(store: Store) -> None:
    opened = _cli(
        store.url,
        "incidents",
        "new",
        "my password is hunter2",
        "--summary",
        "Deploy used api key sk-live-4f9a8b7c6d and secret=Zq81-x; the token count is 42",
    )
    assert opened.exit_code == 0, opened.output
    with store.session() as session:
        incident = session.exec(select(Incident)).one()
        cause = Cause(
            incident_id=incident.id, key="c", catalogue_id="c", title="c", status="suspected"
        )
        record_status_change(
            session,
            cause,
            "rejected",
            actor="t",
            rationale="The password is wrong, not missing; token: ghp_a1b2c3d4e5f6g7 leaked",
        )
        ordinary = open_incident(session, "The api key is missing and the stop token is <eos>")
        assert ordinary.title == "The api key is missing and the stop token is <eos>"
    text = _stored_text(store)
    for secret in ("hunter2", "sk-live-4f9a8b7c6d", "Zq81-x", "ghp_a1b2c3d4e5f6g7"):
        assert secret not in text
    assert "my password is [REDACTED]" in text  # and the slug, made after the redaction
    assert "the token count is 42" in text and "The password is wrong, not missing" in text
    # No fingerprint of the secret: nothing a reader could test a guess against.
    assert "[REDACTED]" in text and "[REDACTED:" not in text
    listed = _cli(store.url, "incidents", "list")
    assert "hunter2" not in listed.output and "my-password-is-redacted" in listed.output


def _stack_with_model(tmp_path: Path, model: str) -> None:
    parse_stack(f'[server]\nmodel = "{model}"\n', base=tmp_path, source="stack.toml")


def test_special_files_in_a_stack_file_are_refused_as_such(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"\$\.server\.model: model file is a character device"):
        _stack_with_model(tmp_path, "/dev/zero")
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(StackError, match=r"\$\.server\.model: model file is a FIFO"):
        _stack_with_model(tmp_path, str(fifo))
    (tmp_path / "weights").mkdir()
    with pytest.raises(StackError, match=r"model file is a directory"):
        _stack_with_model(tmp_path, str(tmp_path / "weights"))
    with pytest.raises(StackError, match=r"model file not found"):
        _stack_with_model(tmp_path, str(tmp_path / "missing.gguf"))
    stack_fifo = tmp_path / "stack.toml"
    os.mkfifo(stack_fifo)
    with pytest.raises(StackError, match=r"is a FIFO"):  # not a read that blocks forever
        load_stack(stack_fifo)
