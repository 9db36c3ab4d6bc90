"""The shipped atlas (kb/atlas/entries): every entry validates, points at a public https
report, and `triage atlas list --json` lists at least the 60 the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kb.atlas import load_entry
from kb.atlas.loader import SHIPPED_DIR, entry_files
from triage.cli import cli

SHIPPED = entry_files(SHIPPED_DIR) if SHIPPED_DIR.is_dir() else []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_entry_validates_and_has_an_https_source(path: Path) -> None:
    entry = load_entry(path)  # schema, id == file name
    assert entry.source.startswith("https://")
    assert all(url.startswith("https://") for url in entry.related)


def test_atlas_list_json_has_at_least_60_entries_each_with_a_public_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRIAGE_ATLAS_PATH", raising=False)
    result = CliRunner().invoke(cli, ["atlas", "list", "--json"])
    assert result.exit_code == 0, result.stderr
    entries = json.loads(result.stdout)
    assert len(entries) >= 60
    assert len({e["id"] for e in entries}) == len(entries)
    assert all(e["source"].startswith("https://") for e in entries)
    assert all(str(Path(e["file"]).parent) == str(SHIPPED_DIR) for e in entries)
