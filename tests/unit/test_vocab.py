"""kb.vocab: (section, id, number) records passed in by the catalogue, family bits for every
recorded number (built-in or plugin), and the store-open check (SQLite and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import date

import pytest
from click.testing import CliRunner
from sqlmodel import select

from kb import vocab
from kb.domain.errors import StoreError
from kb.domain.family import signature
from kb.models import Cause, Incident, Symptom
from kb.repo.family import IncidentSignature, refresh_signatures, similar_incidents
from kb.repo.store import Store
from triage import plugin_api
from triage.catalogue import Catalogue, CatalogueError, catalogue
from triage.catalogue.numbering import check_store_numbering, vocabulary

# Every number stored by a knowledge base before the numbers moved into the catalogue's own
# files (kb/vocab.py up to 0011_embed_batch_vocab). Stored masks use them: they never move.
STORED_CAUSES = {
    "reasoning-exhausts-budget": 0, "speculative-decoding": 1, "quantized-weights": 2,
    "server-build": 3, "output-parsing": 4, "token-limit": 5, "cpu-backend": 6,
    "kv-cache-quant": 7, "context-size": 8, "context-shift": 9, "structured-output": 10,
    "reasoning-leak": 11, "client-handling": 12, "conversation-shape": 13, "model-file": 14,
    "warmup-decode": 15, "cpu-threads": 16, "model-loop": 17, "gateway-timeout": 18,
    "server-flags": 19, "schema-not-enforced": 20, "prompt-cache": 21, "stream-format": 22,
    "embedding-batch": 23,
}  # fmt: skip
STORED_KINDS = {
    "empty-content": 0, "length-stop": 1, "reasoning-exhausted-budget": 2,
    "runaway-reasoning": 3, "tool-args-invalid-json": 4, "tool-args-schema-violation": 5,
    "tool-markup-leaked": 6, "parse-failure": 7, "truncated-stream": 8, "http-error": 9,
    "timeout": 10, "server-crash": 11, "server-hang": 12, "repetition-to-context-end": 13,
    "structured-output-failed": 14, "reasoning-markup-in-content": 15, "client-lost-reply": 16,
    "mojibake": 17, "repetition-loop": 18, "chat-template-missing": 19,
    "base-model-for-chat": 20, "end-of-turn-mismatch": 21, "gateway-error": 22,
    "server-flag-error": 23, "schema-violation": 24, "stream-format-violation": 25,
    "unstable-prefix": 26, "embedding-failed": 27, "template-markup-in-content": 28,
}  # fmt: skip


@dataclass(frozen=True)
class Entry:
    id: str
    number: int


def _catalogue(causes: dict[str, int] | None = None, checks: dict[str, int] | None = None):
    cat = Catalogue()
    for entry_id, number in (STORED_CAUSES if causes is None else causes).items():
        cat.causes.add(Entry(entry_id, number))
    for entry_id, number in (STORED_KINDS if checks is None else checks).items():
        cat.checks.add(Entry(entry_id, number))
    return cat


def test_the_catalogue_keeps_every_stored_number() -> None:
    numbers = vocabulary(catalogue())
    assert {i: n for i, n in numbers.causes.items() if i in STORED_CAUSES} == STORED_CAUSES
    assert {i: n for i, n in numbers.checks.items() if i in STORED_KINDS} == STORED_KINDS
    # Built-ins number below the plugin range, and each number once per section.
    for section in (numbers.causes, numbers.checks):
        assert all(n <= plugin_api.BUILTIN_LAST for n in section.values())
        assert len(set(section.values())) == len(section)


def test_one_first_plugin_number_everywhere() -> None:
    assert plugin_api.PLUGIN_FIRST == plugin_api.BUILTIN_LAST + 1 == 32
    assert plugin_api.FAMILY_BIT_LAST == vocab.BIT_LIMIT - 1


def test_a_plugin_numbers_from_32_and_a_built_in_below() -> None:
    def low(cat: Catalogue) -> None:
        cat.causes.add(Entry("my-cause", 20))

    with pytest.raises(CatalogueError, match=r"my-plugin: cause 'my-cause' uses number 20.*32"):
        Catalogue().register_plugin("my-plugin", low)

    def high(cat: Catalogue) -> None:
        cat.checks.add(Entry("my-kind", 40))

    with pytest.raises(CatalogueError, match=r"built-in symptom check 'my-kind' uses number 40"):
        Catalogue().register_plugin("checks-mine", high, builtin=True)
    ok = Catalogue()
    ok.register_plugin("my-plugin", lambda cat: cat.causes.add(Entry("my-cause", 32)))
    assert ok.causes.numbers() == {"my-cause": 32}


def test_kb_imports_no_vocabulary_and_the_plugin_api_nothing_of_the_project() -> None:
    code = (
        "import sys, kb.models, kb.repo.store, triage.plugin_api\n"
        "mine = sorted(m for m in sys.modules if m.split('.')[0] in ('kb', 'triage'))\n"
        "print(' '.join(mine))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "kb.vocab" not in loaded  # models no longer needs it: no models/vocab/store circle
    assert [m for m in loaded if m.startswith("triage")] == ["triage", "triage.plugin_api"]


def test_a_fresh_store_records_the_catalogue_numbers_once(db_url: str) -> None:
    store = Store(db_url)
    try:
        cat = _catalogue()
        check_store_numbering(store, cat)  # opening checks, writes nothing
        with store.session(readonly=True) as session:
            assert vocab.stored_numbers(session) == {"cause": {}, "check": {}}
        check_store_numbering(store, cat, record=True)
        with store.session(readonly=True) as session:
            stored = vocab.stored_numbers(session)
        assert stored == {"cause": STORED_CAUSES, "check": STORED_KINDS}
        check_store_numbering(store, cat, record=True)  # again: nothing to write
        with store.session(readonly=True) as session:
            rows = session.exec(select(vocab.VocabNumber)).all()
        assert len(rows) == len(STORED_KINDS) + len(STORED_CAUSES)
    finally:
        store.close()


def test_a_catalogue_whose_numbers_moved_is_refused(db_url: str) -> None:
    store = Store(db_url)
    try:
        plugin = _catalogue(checks={**STORED_KINDS, "plug-kind": 40})
        check_store_numbering(store, plugin, record=True)
        # The plugin is gone; another plugin takes its number: its rows would be mis-read.
        moved = _catalogue(checks={**STORED_KINDS, "other-kind": 40})
        with pytest.raises(CatalogueError, match=r"number 40 is stored for 'plug-kind'"):
            check_store_numbering(store, moved, record=True)
        # The plugin comes back with another number.
        renumbered = _catalogue(checks={**STORED_KINDS, "plug-kind": 41})
        with pytest.raises(CatalogueError, match=r"'plug-kind' is stored as number 40"):
            check_store_numbering(store, renumbered)
        # A built-in moved (an older kb numbered model-file 13: now conversation-shape's).
        swapped = {**STORED_CAUSES, "model-file": 13, "conversation-shape": 14}
        with pytest.raises(CatalogueError, match=r"'conversation-shape' is stored as number 13"):
            check_store_numbering(store, _catalogue(causes=swapped))
        with store.session(readonly=True) as session:
            assert "other-kind" not in vocab.stored_numbers(session)["check"]
        # Without the plugin, the store still opens.
        check_store_numbering(store, _catalogue())
    finally:
        store.close()


def test_record_numbers_refuses_a_conflicting_row(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.session() as session:
            assert vocab.record_numbers(session, "cause", {"a-cause": 33}) == ["a-cause"]
        with pytest.raises(Exception, match="(?i)unique|duplicate"):
            with store.session() as session:
                vocab.record_numbers(session, "cause", {"b-cause": 33})
        with store.session(readonly=True) as session:
            assert vocab.stored_numbers(session)["cause"] == {"a-cause": 33}
        with pytest.raises(ValueError, match="unknown vocabulary section"):
            with store.session() as session:
                vocab.record_numbers(session, "format", {"x": 1})
    finally:
        store.close()


def test_the_cli_refuses_a_store_recorded_with_other_numbers(db_url: str) -> None:
    from triage.cli import cli

    store = Store(db_url)
    try:
        with store.session() as session:
            vocab.record_numbers(session, "check", {"empty-content": 12})
    finally:
        store.close()
    result = CliRunner().invoke(cli, ["--database", db_url, "incidents", "list"])
    assert result.exit_code == 1
    assert "cannot use this knowledge base" in result.output
    assert "'empty-content' is stored as number 12 but numbered 0 now" in result.output
    assert "Traceback" not in result.output


def _incident(session, slug: str, kinds: list[str], causes: list[str]) -> None:
    incident = Incident(slug=slug, title=slug, opened_on=date(2026, 6, 10))
    session.add(incident)
    session.flush()
    for index, kind in enumerate(kinds):
        session.add(Symptom(incident_id=incident.id, key=f"S{index}", kind=kind, description=kind))
    for cause in causes:
        session.add(
            Cause(
                incident_id=incident.id,
                key=cause,
                catalogue_id=cause,
                title=cause,
                status="confirmed",
            )
        )
    session.flush()


def test_the_first_signature_write_records_the_numbers_and_refuses_moved_ones(
    db_url: str,
) -> None:
    store = Store(db_url)
    numbers = vocabulary(_catalogue())
    try:
        with store.session() as session:
            _incident(session, "2026-01-01-a", ["empty-content"], ["token-limit"])
        with store.session() as session:
            assert refresh_signatures(session, vocabulary=numbers) == 1
        with store.session(readonly=True) as session:
            assert vocab.stored_numbers(session) == {"cause": STORED_CAUSES, "check": STORED_KINDS}
            row = session.get(IncidentSignature, 1)
            assert row is not None
            assert (row.kinds_mask, row.causes_mask) == (1 << 0, 1 << 5)
        # A knowledge base written with other numbers is refused before a mask is written.
        with store.session() as session:
            row = session.get(vocab.VocabNumber, ("check", "timeout"))
            assert row is not None
            row.number = 30  # a number no built-in kind uses
            session.add(row)
        with store.session() as session:
            _incident(session, "2026-01-02-b", ["timeout"], [])
        with pytest.raises(StoreError, match=r"check 'timeout' is stored as number 30"):
            with store.session() as session:
                refresh_signatures(session, vocabulary=numbers)
    finally:
        store.close()


def test_a_plugin_cause_and_check_get_family_bits_like_built_ins(db_url: str) -> None:
    plugin = Catalogue.load()
    plugin.register_plugin(
        "my-plugin",
        lambda cat: (cat.causes.add(Entry("my-cause", 40)), cat.checks.add(Entry("my-kind", 41))),
    )
    store = Store(db_url)
    try:
        with store.session() as session:
            _incident(session, "2026-01-01-plugin", ["my-kind"], ["my-cause"])
            _incident(session, "2026-01-02-builtin", ["empty-content"], ["kv-cache-quant"])
            _incident(session, "2026-01-03-other", ["timeout", "far-kind"], ["server-build"])
            refresh_signatures(session, vocabulary=vocabulary(plugin))
        with store.session(readonly=True) as session:
            rows = {r.incident_id: r for r in session.exec(select(IncidentSignature)).all()}
            assert (rows[1].kinds_mask, rows[1].causes_mask) == (1 << 41, 1 << 40)
            assert (rows[2].kinds_mask, rows[2].causes_mask) == (1 << 0, 1 << 7)
            # An id the catalogue does not number has no bit (matched by its text).
            assert rows[3].kinds_mask == 1 << 10 and rows[3].kinds == "far-kind,timeout"
            assert vocab.family_bits(session)["cause"]["my-cause"] == 1 << 40
            by_plugin = similar_incidents(session, signature(["my-kind"], ["my-cause"], {}))
            by_builtin = similar_incidents(
                session, signature(["empty-content"], ["kv-cache-quant"], {})
            )
            by_text = similar_incidents(session, signature(["far-kind"], [], {}))
        assert [(m.slug, m.score) for m in by_plugin] == [("2026-01-01-plugin", 1.0)]
        assert by_plugin[0].shared_causes == ["my-cause"]
        assert [m.slug for m in by_builtin] == ["2026-01-02-builtin"]
        assert [m.slug for m in by_text] == ["2026-01-03-other"]
    finally:
        store.close()


def _stale(session) -> dict[int, bool]:
    return {r.incident_id: r.stale for r in session.exec(select(IncidentSignature)).all()}


def test_a_newly_recorded_number_marks_the_signatures_holding_it_stale(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.session() as session:
            _incident(session, "2026-01-01-a", ["my-kind"], [])
            _incident(session, "2026-01-02-b", ["timeout"], [])
            refresh_signatures(session, vocabulary=vocabulary(_catalogue()))
        with store.session(readonly=True) as session:
            assert _stale(session) == {1: False, 2: False}
            assert session.get(IncidentSignature, 1).kinds_mask == 0  # my-kind: no number yet
        later = vocabulary(_catalogue(checks={**STORED_KINDS, "my-kind": 40}))
        with store.session() as session:
            assert vocab.record_vocabulary(session, later)["check"] == ["my-kind"]
        with store.session(readonly=True) as session:
            # Its bit now reads as "not there" in the old mask: that row is recomputed.
            assert _stale(session) == {1: True, 2: False}
            found = similar_incidents(session, signature(["my-kind"], [], {}))
        assert [m.slug for m in found] == ["2026-01-01-a"]
        with store.session() as session:
            assert refresh_signatures(session, vocabulary=later) == 1
        with store.session(readonly=True) as session:
            assert session.get(IncidentSignature, 1).kinds_mask == 1 << 40
            assert [m.slug for m in similar_incidents(session, signature(["my-kind"], [], {}))] == [
                "2026-01-01-a"
            ]
    finally:
        store.close()


def test_upgrade_to_0003_marks_every_signature_stale(db_url: str) -> None:
    store = Store(db_url, migrate=False)
    try:
        store.upgrade("0002_search")
        with store.session() as session:
            _incident(session, "2026-01-01-a", ["empty-content"], ["token-limit"])
            # What a 0002-era refresh left: a fresh row with tuple-order bits.
            session.connection().exec_driver_sql(
                "UPDATE incidentsignature SET stale = false, kinds_mask = 1, causes_mask = 32"
            )
        with store.session(readonly=True) as session:
            assert [r.stale for r in session.exec(select(IncidentSignature)).all()] == [False]
        store.upgrade()
        with store.session(readonly=True) as session:
            assert [r.stale for r in session.exec(select(IncidentSignature)).all()] == [True]
            assert vocab.stored_numbers(session) == {"cause": {}, "check": {}}
        store.downgrade("0002_search")
        store.upgrade()
    finally:
        store.close()
