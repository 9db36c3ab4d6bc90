"""Revisit trigger kinds are one class each in one registry: the built-ins reach the
catalogue through their entry point, and a plugin's kind (one module, installed through
the entry point alone) works in `triage decide --when` and `triage parked`."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from plugin_dist import installed

from kb import triggers
from kb.domain.triggers import DecisionError
from kb.models import Incident
from kb.repo.decisions import parse_trigger
from kb.repo.store import Store, add_evidence, require_incident
from triage.catalogue import catalogue
from triage.cli import cli

PLUGIN = '''
import re

from kb.triggers import BaseKind, TriggerState


class Mentions(BaseKind):
    """Fires when evidence recorded after parking mentions a word."""

    id = "mentions"
    syntax = "mentions=WORD"

    def parse(self, text):
        match = re.fullmatch(r"mentions=(\\S+)", text.strip())
        return {"kind": self.id, "word": match.group(1)} if match else None

    def describe(self, trigger):
        return f"evidence that mentions {trigger['word']!r}"

    def check(self, trigger, context):
        for row in context.after:
            if trigger["word"] in row.summary:
                return TriggerState(trigger, self.describe(trigger), True,
                                    f"mentioned in [{row.key}]", (row.key,))
        return TriggerState(trigger, self.describe(trigger), False, "not mentioned yet")


def register(catalogue):
    catalogue.triggers.add(Mentions())
'''
SLUG = "2026-07-01-plugin-trigger"


def test_the_builtin_kinds_come_through_their_entry_point() -> None:
    section = catalogue().triggers
    assert section.ids() == ("new-build", "new-weights", "failure-rate", "date")
    assert {section.origin(kind) for kind in section.ids()} == {"triggers"}
    assert parse_trigger("failure-rate>20%,min=3", section) == {
        "kind": "failure-rate",
        "threshold": 0.2,
        "min_captures": 3,
    }
    with pytest.raises(DecisionError, match=r"expected one of: new-build\[>BUILD\]"):
        parse_trigger("mentions=flash-attn", section)


def _run(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--database", db_url, *args], catch_exceptions=False)


def test_a_plugin_trigger_kind_parks_and_fires(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_TODAY", "2026-07-02")
    store = Store(db_url)
    try:
        with store.session() as session:
            session.add(Incident(slug=SLUG, title="plugin trigger", opened_on=date(2026, 7, 1)))
    finally:
        store.close()
    refused = _run(db_url, "decide", SLUG, "--parked", "--why", "w", "--when", "mentions=fa")
    assert refused.exit_code == 1 and "unknown trigger 'mentions=fa'" in refused.output

    with installed(tmp_path, "mentions_trigger", PLUGIN):
        assert "mentions" in catalogue().triggers
        parked = _run(
            db_url,
            "decide",
            SLUG,
            "--parked",
            "--why",
            "waiting for a fix",
            "--when",
            "mentions=flash-attn",
        )
        assert parked.exit_code == 0, parked.output
        assert "trigger: evidence that mentions 'flash-attn'" in parked.output
        waiting = _run(db_url, "parked")
        assert "[waiting] evidence that mentions 'flash-attn': not mentioned yet" in waiting.output

        store = Store(db_url)
        try:
            with store.session() as session:
                add_evidence(
                    session,
                    incident_id=require_incident(session, SLUG).id,
                    kind="reference",
                    summary="upstream fixed flash-attn on CPU",
                )
        finally:
            store.close()
        monkeypatch.setenv("TRIAGE_TODAY", "2099-01-01")  # the evidence is dated today (UTC)
        due = _run(db_url, "parked", "--due")
        assert due.exit_code == 0, due.output
        assert f"{SLUG}  DUE" in due.output
        assert "[FIRED] evidence that mentions 'flash-attn': mentioned in [E1]" in due.output

    # The plugin is uninstalled: the stored trigger is shown and left for a person.
    gone = _run(db_url, "parked")
    assert "unknown trigger kind 'mentions': check by hand" in gone.output


def test_kb_alone_reads_its_builtin_kinds() -> None:
    assert triggers.describe({"kind": "new-build", "after": 9586, "note": "n"}) == (
        "a llama-server build newer than b9586 (n)"
    )
    with pytest.raises(DecisionError, match="unknown trigger kind 'mentions'"):
        triggers.normalise({"kind": "mentions", "word": "x"})
    with pytest.raises(ValueError, match="already registered"):
        triggers.TriggerKinds([triggers.NewBuild(), triggers.NewBuild()])
