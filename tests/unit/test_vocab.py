"""kb.vocab: stable numbers, stored id -> number records, and the catalogue's numbering check
(SQLite and PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import pytest
from click.testing import CliRunner
from sqlmodel import select

from kb import vocab
from kb.domain.family import signature
from kb.models import CAUSE_CATALOGUE_IDS, Cause, Incident, Symptom
from kb.repo.family import (
    CAUSE_BITS,
    KIND_BITS,
    IncidentSignature,
    refresh_signatures,
    similar_incidents,
)
from kb.repo.store import Store
from triage.catalogue import Catalogue, CatalogueError
from triage.catalogue.numbering import check_numbering, check_store_numbering


@dataclass(frozen=True)
class Entry:
    id: str
    number: int


def _catalogue(causes: dict[str, int] | None = None, checks: dict[str, int] | None = None):
    catalogue = Catalogue()
    causes = {t.id: t.number for t in vocab.CATALOGUE_CAUSES} if causes is None else causes
    checks = dict(vocab.KIND_NUMBERS) if checks is None else checks
    for entry_id, number in causes.items():
        catalogue.causes.add(Entry(entry_id, number))
    for entry_id, number in checks.items():
        catalogue.checks.add(Entry(entry_id, number))
    return catalogue


def test_numbers_are_the_documented_ones_and_bits_follow_them() -> None:
    assert [(t.id, t.number) for t in vocab.FINDING_KINDS][:3] == [
        ("empty-content", 0),
        ("length-stop", 1),
        ("reasoning-exhausted-budget", 2),
    ]
    assert vocab.KIND_NUMBERS["timeout"] == 10
    assert vocab.CAUSE_NUMBERS["token-limit"] == 5
    assert vocab.CAUSE_NUMBERS["cpu-backend"] == 6
    assert vocab.CAUSE_NUMBERS["model-file"] == 14
    assert CAUSE_CATALOGUE_IDS == (
        "reasoning-exhausts-budget",
        "speculative-decoding",
        "quantized-weights",
        "server-build",
        "output-parsing",
        "token-limit",
    )
    assert KIND_BITS["http-error"] == 1 << 9
    assert CAUSE_BITS["output-parsing"] == 1 << 4
    assert CAUSE_BITS["kv-cache-quant"] == 1 << 7  # reserved ids have their bit already


def test_a_fresh_store_records_the_catalogue_numbers_once(db_url: str) -> None:
    store = Store(db_url)
    try:
        catalogue = _catalogue()
        check_store_numbering(store, catalogue)  # opening checks, writes nothing
        with store.session(readonly=True) as session:
            assert vocab.stored_numbers(session) == {"cause": {}, "check": {}}
        check_store_numbering(store, catalogue, record=True)
        with store.session(readonly=True) as session:
            stored = vocab.stored_numbers(session)
        assert stored["check"] == vocab.KIND_NUMBERS
        assert stored["cause"]["token-limit"] == 5
        check_store_numbering(store, catalogue, record=True)  # again: nothing to write
        with store.session(readonly=True) as session:
            rows = session.exec(select(vocab.VocabNumber)).all()
        assert len(rows) == len(vocab.KIND_NUMBERS) + len(vocab.CATALOGUE_CAUSES)
    finally:
        store.close()


def test_a_catalogue_whose_numbers_moved_is_refused(db_url: str) -> None:
    store = Store(db_url)
    try:
        plugin = _catalogue(checks={**vocab.KIND_NUMBERS, "plug-kind": 40})
        check_store_numbering(store, plugin, record=True)
        # The plugin is gone; another plugin takes its number: its rows would be mis-read.
        moved = _catalogue(checks={**vocab.KIND_NUMBERS, "other-kind": 40})
        with pytest.raises(CatalogueError, match=r"number 40 is stored for 'plug-kind'"):
            check_store_numbering(store, moved, record=True)
        # The plugin comes back with another number.
        renumbered = _catalogue(checks={**vocab.KIND_NUMBERS, "plug-kind": 41})
        with pytest.raises(CatalogueError, match=r"'plug-kind' is stored as number 40"):
            check_store_numbering(store, renumbered)
        with store.session(readonly=True) as session:
            assert "other-kind" not in vocab.stored_numbers(session)["check"]
        # Without the plugin, the store still opens.
        check_store_numbering(store, _catalogue())
    finally:
        store.close()


def test_built_in_ids_keep_kb_numbers_and_plugins_number_from_32() -> None:
    swapped = {t.id: t.number for t in vocab.CATALOGUE_CAUSES}
    swapped["server-build"], swapped["token-limit"] = 5, 3
    with pytest.raises(CatalogueError, match=r"'server-build'.*number 5.*kb.vocab numbers it 3"):
        check_numbering(_catalogue(causes=swapped), {})
    with pytest.raises(CatalogueError, match=r"numbers below 32"):
        check_numbering(_catalogue(causes={"my-cause": 20}), {})
    check_numbering(_catalogue(causes={"my-cause": 32}), {})


def test_a_store_recorded_by_a_kb_with_other_numbers_is_refused_on_open(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.session() as session:  # an older kb numbered model-file 13
            vocab.record_numbers(session, "cause", {"model-file": 13})
        with pytest.raises(CatalogueError, match=r"kb.vocab numbers cause .*'model-file'"):
            check_store_numbering(store, _catalogue())
    finally:
        store.close()


def test_record_numbers_refuses_a_conflicting_row(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.session() as session:
            assert vocab.record_numbers(session, "cause", {"a-cause": 33}) == 1
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
    assert "this knowledge base stored 'empty-content' as 12" in result.output
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


def test_the_first_signature_write_records_kb_numbers_and_refuses_moved_ones(
    db_url: str,
) -> None:
    from kb.domain.errors import StoreError

    store = Store(db_url)
    try:
        with store.session() as session:
            _incident(session, "2026-01-01-a", ["empty-content"], ["token-limit"])
        with store.session() as session:
            assert refresh_signatures(session) == 1
        with store.session(readonly=True) as session:
            assert vocab.stored_numbers(session) == vocab.builtin_numbers()
        # A knowledge base written by a kb that numbered things differently is refused.
        with store.session() as session:
            row = session.get(vocab.VocabNumber, ("check", "timeout"))
            assert row is not None
            row.number = 30  # a number no built-in kind uses
            session.add(row)
        with store.session() as session:
            _incident(session, "2026-01-02-b", ["timeout"], [])
        moved = r"check 'timeout' as 10, but .* stored 'timeout' as 30"
        with pytest.raises(StoreError, match=moved):
            with store.session() as session:
                refresh_signatures(session)
    finally:
        store.close()


def test_plugin_and_reserved_ids_match_in_family_search(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.session() as session:
            _incident(session, "2026-01-01-plugin", ["plug-kind"], ["my-plugin-cause"])
            _incident(session, "2026-01-02-reserved", ["empty-content"], ["kv-cache-quant"])
            _incident(session, "2026-01-03-other", ["timeout"], ["server-build"])
            refresh_signatures(session)
        with store.session(readonly=True) as session:
            row = session.get(IncidentSignature, 2)
            assert row is not None and row.causes_mask == CAUSE_BITS["kv-cache-quant"]
            by_text = similar_incidents(session, signature(["plug-kind"], ["my-plugin-cause"], {}))
            by_bit = similar_incidents(
                session, signature(["empty-content"], ["kv-cache-quant"], {})
            )
        assert [m.slug for m in by_text] == ["2026-01-01-plugin"]
        assert by_text[0].score == 1.0
        assert [m.slug for m in by_bit] == ["2026-01-02-reserved"]
        assert by_bit[0].shared_causes == ["kv-cache-quant"]
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
