"""Redaction markers are HMAC-SHA256 fingerprints under a per-installation key (issue 17):
equal secrets match within one installation, a reader of the knowledge base cannot test a
guessed key against them, and the key itself never reaches the knowledge base."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import triage.capture.fingerprint as fp
from triage.capture import redact_headers, redaction_marker
from triage.cli import cli

SECRET = "sk-fingerprint-canary-0123456789"
OK = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'


def use_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("TRIAGE_HOME", str(home))
    monkeypatch.setattr(fp, "_keys", {})


def test_key_is_created_on_first_use_private_and_reused(tmp_path, monkeypatch):
    use_home(monkeypatch, tmp_path / "home")
    key_file = tmp_path / "home" / "redaction.key"
    assert not key_file.exists()
    marker = redaction_marker(SECRET)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text().strip())
    assert len(key) == 32
    expected = hmac.new(key, SECRET.encode(), hashlib.sha256).hexdigest()[:12]
    assert marker == f"[REDACTED:hmac:{expected}]"
    monkeypatch.setattr(fp, "_keys", {})  # a new process reads the same key
    assert redaction_marker(SECRET) == marker
    assert [p.name for p in key_file.parent.iterdir()] == ["redaction.key"]  # no temp left


def test_equal_secrets_match_within_an_installation_only(tmp_path, monkeypatch):
    use_home(monkeypatch, tmp_path / "team-a")
    a1 = redact_headers({"Authorization": f"Bearer {SECRET}"})
    a2 = redact_headers({"x-api-key": SECRET})
    use_home(monkeypatch, tmp_path / "team-b")
    b1 = redact_headers({"Authorization": f"Bearer {SECRET}"})
    assert a1["authorization"].split(" ")[1] == a2["x-api-key"]
    assert a1 != b1
    unsalted = hashlib.sha256(SECRET.encode()).hexdigest()
    for marker in (a2["x-api-key"], b1["authorization"]):
        assert unsalted[:8] not in marker and unsalted[:12] not in marker


def test_a_loose_key_file_is_tightened(tmp_path, monkeypatch):
    use_home(monkeypatch, tmp_path / "home")
    redaction_marker(SECRET)
    key_file = tmp_path / "home" / "redaction.key"
    os.chmod(key_file, 0o644)
    monkeypatch.setattr(fp, "_keys", {})
    redaction_marker(SECRET)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_unusable_data_dir_still_never_gives_an_unsalted_hash(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    use_home(monkeypatch, blocker / "home")
    marker = redaction_marker(SECRET)
    assert marker.startswith("[REDACTED:hmac:")
    assert hashlib.sha256(SECRET.encode()).hexdigest()[:8] not in marker
    assert "redaction key unavailable" in caplog.text
    assert SECRET not in caplog.text


def test_the_key_never_reaches_the_knowledge_base(tmp_path, monkeypatch):
    use_home(monkeypatch, tmp_path / "home")
    db = tmp_path / "kb.db"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", f"sqlite:///{db}")
    record = {
        "request": {"messages": [], "api_key": SECRET},
        "response": json.loads(OK),
        "request_headers": {"Authorization": f"Bearer {SECRET}"},
    }
    capture = tmp_path / "c.jsonl"
    capture.write_text(json.dumps(record) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["capture", str(capture)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    key_hex = (tmp_path / "home" / "redaction.key").read_text().strip()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("kb.db*"))
    assert SECRET.encode() not in stored
    assert key_hex.encode() not in stored
    assert redaction_marker(SECRET).encode() in stored
