"""Full-text search on SQLite FTS5 and PostgreSQL tsvector: ranking, snippets, filters,
hostile queries, and the index kept current by triggers for every writer."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kb_rows import QWEN, REFERENCE, add_incident, add_reference_incidents
from sqlmodel import select

from kb.models import Cause, Evidence, Incident, Symptom
from kb.repo.search import HIGHLIGHT_END, HIGHLIGHT_START, SearchHit, query_terms, search
from kb.repo.store import Store, add_evidence

INCIDENTS_DIR = Path(__file__).resolve().parents[2] / "incidents"
HOSTILE = [
    "",
    "   ",
    '"',
    '"unbalanced',
    "'",
    "*",
    "empt*",
    "NEAR(",
    "NEAR(empty content, 2)",
    "-",
    "-empty",
    "content -empty",
    "empty AND",
    "OR",
    "NOT empty",
    "AND OR NOT",
    "title:empty",
    "{title summary}: empty",
    "^empty",
    "(",
    ")",
    "empty + content",
    "a & b | !c",
    "foo:*",
    "'a':* & !",
    "<->",
    "\\",
    "%_%",
    "'; DROP TABLE incident; --",
    "\x00",
    "null\x00byte",
    "한국어 빈 응답",
    "思考 预算",
    "émpty cöntent",
    "😀 empty",
    "ﬁnish",
    "x" * 5000,
    " ".join(["empty"] * 200),
    "the a an of",
    "_",
    "finish_reason=length",
]


@pytest.fixture
def reference_store(store: Store) -> Store:
    with store.session() as session:
        add_reference_incidents(session)
    return store


def _slugs(hits: list[SearchHit]) -> list[str]:
    return [hit.slug for hit in hits]


# ------------------------------------------------------------------ pure


def test_query_terms_keep_only_words() -> None:
    assert query_terms('NEAR("empty" content*) -finish_reason=length') == [
        "near",
        "empty",
        "content",
        "finish",
        "reason",
        "length",
    ]
    assert query_terms("") == []
    assert query_terms("*** -- ()") == []
    assert query_terms("Empty EMPTY empty") == ["empty"]
    assert len(query_terms(" ".join(f"w{i}" for i in range(100)))) == 32
    assert query_terms("한국어 응답") == ["한국어", "응답"]


# ------------------------------------------------------------------ the reference incident


def test_reference_query_finds_the_reference_incident(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        hits = search(session, "empty content finish length thinking")
    assert REFERENCE in _slugs(hits)
    assert all(not hit.partial for hit in hits)
    # Unrelated incidents that share some of the words are not there: every word must match.
    assert "2026-04-01-mistral-timeouts" not in _slugs(hits)
    reference = hits[_slugs(hits).index(REFERENCE)]
    assert reference.status == "parked"
    assert HIGHLIGHT_START in reference.snippet and HIGHLIGHT_END in reference.snippet


def test_reference_query_finds_the_imported_reference_file(store: Store) -> None:
    from kb.repo.files import import_paths

    import_paths(store, [INCIDENTS_DIR])
    with store.session(readonly=True) as session:
        hits = search(session, "empty content finish length thinking")
        assert _slugs(hits)[0] == REFERENCE
        qwen = search(session, "qwen retry spiral")
    assert {hit.slug for hit in qwen} >= {path.stem for path in INCIDENTS_DIR.glob("*qwen*.md")}


# ------------------------------------------------------------------ ranking and snippets


def test_title_hits_rank_above_hits_in_long_text(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        hits = search(session, "speculative")
    slugs = _slugs(hits)
    assert slugs[0] == "2026-03-09-llama3-spec-json"
    assert hits[0].field == "title"
    assert REFERENCE in slugs
    assert hits[0].score >= hits[-1].score


def test_snippet_highlights_the_matching_words_in_the_field_that_matched(
    reference_store: Store,
) -> None:
    with reference_store.session(readonly=True) as session:
        (hit,) = search(session, "2797")
        assert hit.slug == REFERENCE
        assert hit.field == "evidence"
        assert f"{HIGHLIGHT_START}2797{HIGHLIGHT_END}" in hit.snippet
        (hit,) = search(session, "lossless distribution")
        assert hit.field == "causes"
        (hit,) = search(session, "non-core")
        assert hit.field == "decisions"


def test_stemming_and_prefixes(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        # "thinks" and "thinking" share a stem; "qwen" is a prefix of "qwen3".
        assert REFERENCE in _slugs(search(session, "thinking forever"))
        assert set(_slugs(search(session, "qwen"))) == set(QWEN)
        assert set(_slugs(search(session, "QWEN3"))) == set(QWEN)


def test_no_incident_has_every_word_falls_back_to_partial_matches(
    reference_store: Store,
) -> None:
    with reference_store.session(readonly=True) as session:
        hits = search(session, "zyxwvut mistral")
        assert _slugs(hits) == ["2026-04-01-mistral-timeouts"]
        assert hits[0].partial
        assert search(session, "zyxwvut") == []


def test_filters_by_status_and_cause(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        assert set(_slugs(search(session, "empty", status="fixed"))) == set(QWEN)
        assert set(_slugs(search(session, "empty", status=["fixed", "parked"]))) == {
            REFERENCE,
            *QWEN,
        }
        assert search(session, "empty", status="closed") == []
        # A rejected cause does not count: quantization was rejected in the reference.
        assert search(session, "empty", cause="quantized-weights") == []
        assert _slugs(search(session, "empty", cause="speculative-decoding")) == [REFERENCE]
        assert set(_slugs(search(session, "content", cause="reasoning-exhausts-budget"))) == {
            REFERENCE,
            *QWEN,
        }
        with pytest.raises(ValueError, match="unknown incident status"):
            search(session, "empty", status="bogus")


def test_limit(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        assert len(search(session, "content", limit=2)) == 2
        assert len(search(session, "content", limit=0)) == 1


# ------------------------------------------------------------------ hostile queries


def test_hostile_queries_never_raise(reference_store: Store) -> None:
    with reference_store.session(readonly=True) as session:
        for query in HOSTILE:
            hits = search(session, query, status=["open", "parked"], cause="x'; --")
            assert isinstance(hits, list), query
            hits = search(session, query)
            assert all(isinstance(hit, SearchHit) for hit in hits), query
        assert REFERENCE in _slugs(search(session, '"unbalanced thinking'))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query=st.text(max_size=80))
def test_fuzzed_queries_never_raise(reference_store: Store, query: str) -> None:
    with reference_store.session(readonly=True) as session:
        search(session, query)


# ------------------------------------------------------------------ the index follows writes


def test_index_follows_inserts_updates_and_deletes(store: Store) -> None:
    with store.session() as session:
        incident = add_incident(session, "2026-07-01-sync", "Original headline")
        other = add_incident(session, "2026-07-02-other", "Another incident")
        assert incident.id is not None and other.id is not None
        add_evidence(session, incident_id=incident.id, kind="log", summary="kumquat overflow")
        add_evidence(session, incident_id=None, kind="exchange", summary="unattached capture")
        session.add(Symptom(incident_id=incident.id, key="S1", kind="timeout", description="d"))
    with store.session(readonly=True) as session:
        assert _slugs(search(session, "kumquat")) == ["2026-07-01-sync"]
        assert _slugs(search(session, "original headline")) == ["2026-07-01-sync"]
        assert search(session, "unattached") == []

    with store.session() as session:
        row = session.exec(select(Incident).where(Incident.slug == "2026-07-01-sync")).one()
        row.title = "Renamed headline"
        session.add(row)
        evidence = session.exec(select(Evidence).where(Evidence.summary.like("kumquat%"))).one()  # type: ignore[attr-defined]
        evidence.incident_id = other.id  # moved to the other incident
        session.add(evidence)
        unattached = session.exec(
            select(Evidence).where(Evidence.incident_id.is_(None))  # type: ignore[union-attr]
        ).one()
        unattached.incident_id = incident.id  # attached later
        session.add(unattached)
    with store.session(readonly=True) as session:
        assert search(session, "original") == []
        assert _slugs(search(session, "renamed")) == ["2026-07-01-sync"]
        assert _slugs(search(session, "kumquat")) == ["2026-07-02-other"]
        assert _slugs(search(session, "unattached")) == ["2026-07-01-sync"]
        assert _slugs(search(session, "timeout")) == ["2026-07-01-sync"]

    with store.session() as session:
        for symptom in session.exec(select(Symptom)).all():
            session.delete(symptom)
        gone = session.exec(select(Incident).where(Incident.slug == "2026-07-02-other")).one()
        session.delete(gone)
    with store.session(readonly=True) as session:
        assert search(session, "timeout") == []
        assert search(session, "kumquat") == []
        assert _slugs(search(session, "renamed")) == ["2026-07-01-sync"]


def test_cause_status_changes_are_searchable(reference_store: Store) -> None:
    with reference_store.session() as session:
        cause = session.exec(select(Cause).where(Cause.key == "speculative-decoding")).all()
        for row in cause:
            row.rationale = "zanzibar measured with a second server"
            session.add(row)
    with reference_store.session(readonly=True) as session:
        assert set(_slugs(search(session, "zanzibar"))) == {
            REFERENCE,
            "2026-03-09-llama3-spec-json",
        }


def test_upgrade_indexes_rows_written_before_the_search_migration(db_url: str) -> None:
    store = Store(db_url, migrate=False)
    try:
        store.upgrade("0001_initial")
        with store.session() as session:
            incident = Incident(
                slug="2026-01-05-before", title="Written before search", opened_on=date(2026, 1, 5)
            )
            session.add(incident)
            session.flush()
            assert incident.id is not None
            add_evidence(session, incident_id=incident.id, kind="log", summary="pomegranate")
            session.add(
                Cause(
                    incident_id=incident.id,
                    key="token-limit",
                    catalogue_id="token-limit",
                    title="limit",
                    status="confirmed",
                )
            )
        store.upgrade()
        with store.session(readonly=True) as session:
            assert _slugs(search(session, "pomegranate before")) == ["2026-01-05-before"]
            assert _slugs(search(session, "limit", cause="token-limit")) == ["2026-01-05-before"]
        store.downgrade("0001_initial")
        store.upgrade()
        with store.session(readonly=True) as session:
            assert _slugs(search(session, "pomegranate")) == ["2026-01-05-before"]
    finally:
        store.close()


# ------------------------------------------------------------------ the command line


def test_search_command(reference_store: Store) -> None:
    import json

    from click.testing import CliRunner

    from triage.cli import cli

    runner = CliRunner()
    base = ["--database", reference_store.url, "search"]
    result = runner.invoke(cli, [*base, "empty", "content", "finish", "length", "thinking"])
    assert result.exit_code == 0, result.output
    assert REFERENCE in result.output
    result = runner.invoke(cli, [*base, "empty", "--status", "fixed", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {hit["slug"] for hit in data["hits"]} == set(QWEN)
    for query in ('NEAR("x', "*", "-"):
        result = runner.invoke(cli, [*base, query])
        assert result.exit_code == 0, result.output
        assert "no incident matches" in result.output
    result = runner.invoke(cli, [*base, "empty", "--status", "bogus"])
    assert result.exit_code == 2


def test_search_scores_read_as_relevance_not_raw_numbers(reference_store: Store) -> None:
    import json
    import re

    from click.testing import CliRunner

    from triage.cli import cli
    from triage.commands.search import relevance, relevance_text

    runner = CliRunner()
    base = ["--database", reference_store.url, "search", "empty"]
    result = runner.invoke(cli, base)
    assert result.exit_code == 0, result.output
    ranked = [line for line in result.output.splitlines() if re.match(r"\s*\d+\. ", line)]
    assert len(ranked) >= 2
    assert "relevance 100%" in ranked[0]
    assert all(re.search(r"relevance (\d+%|<1%)  \(matched in ", line) for line in ranked)
    assert not re.search(r"\de-\d", result.output)  # no 1.1e-05
    data = json.loads(runner.invoke(cli, [*base, "--json"]).output)
    shares = [hit["relevance"] for hit in data["hits"]]
    assert shares[0] == 1.0 and shares == sorted(shares, reverse=True)
    assert all(0 < share <= 1 for share in shares)
    assert relevance_text(relevance(1.1e-05, 0.5)) == "relevance <1%"
    assert relevance_text(relevance(0.19, 0.5)) == "relevance 38%"
    assert relevance_text(relevance(0.498, 0.5)) == "relevance 99%"
    assert relevance_text(relevance(0.0, 0.0)) == "relevance -"
