"""Family matching on SQLite and PostgreSQL: signatures, the similarity both in SQL and in
Python, stale signatures, family links, and the Qwen family of the reference incident."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kb_rows import QWEN, REFERENCE, add_incident, add_reference_incidents
from sqlmodel import select

from kb.domain import flags
from kb.domain.errors import StoreError
from kb.domain.family import Signature, signature, similarity, stack_fingerprint
from kb.models import FamilyLink, Incident, Symptom
from kb.repo.family import (
    IncidentSignature,
    incident_signature,
    link_family,
    refresh_signatures,
    similar_incidents,
)
from kb.repo.store import Store

INCIDENTS_DIR = Path(__file__).resolve().parents[2] / "incidents"
# What a capture of the Gemma 4 thinking-budget drill shows: no content, a length stop,
# reasoning that used the whole budget; a Gemma model file, the current build, no spec.
DRILL_KINDS = {"reasoning-exhausted-budget", "empty-content", "length-stop"}
DRILL_STACK: dict[str, Any] = {
    "model": "gemma4-thinking-budget-qat.gguf",
    "args": ["-c", "4096", "--jinja"],
    "server_build": "b11434",
}


@pytest.fixture
def family_store(store: Store) -> Store:
    with store.session() as session:
        add_reference_incidents(session)
    return store


# ------------------------------------------------------------------ pure


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ({"model": "gemma-4-31b-it-qat-q4_0.gguf"}, "gemma"),
        ({"model": "/models/Qwen3-30B-A3B-Q4_K_M.gguf"}, "qwen"),
        ({"model": "Gemma 4 (size not recorded)"}, "gemma"),
        ({"model": "/opt/llama.cpp/models/mistral-small-24b.gguf"}, "mistral"),
        ({"model": "codellama-7b.gguf"}, "llama"),
        ({"model": "Meta-Llama-3.1-8B-Instruct.gguf"}, "llama"),
        ({"model": "deepseek-r1-distill-qwen-32b.gguf"}, "deepseek"),
        ({"model": "", "weights": "phi-4-q8_0.gguf"}, "phi"),
        ({"model": "mystery.gguf"}, ""),
        ({"model": "anything.gguf", "model_family": "Qwen"}, "qwen"),
        ({}, ""),
    ],
)
def test_model_family(stack: dict[str, Any], expected: str) -> None:
    assert stack_fingerprint(stack)["model_family"] == expected


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ({"server_build": "b9586"}, "9586"),
        ({"server_build": "llama.cpp b11434 (abc1234)"}, "11434"),
        ({"build_info": "11434-deadbeef"}, "11434"),
        ({"binary": "/opt/llama-b9500/llama-server"}, "9500"),
        ({"server_build": "custom"}, "custom"),
        ({}, ""),
    ],
)
def test_server_build(stack: dict[str, Any], expected: str) -> None:
    assert stack_fingerprint(stack)["server_build"] == expected


@pytest.mark.parametrize(
    ("stack", "spec", "thinking"),
    [
        ({"args": ["--spec-type", "draft-mtp", "-md", "d.gguf"]}, "on", ""),
        ({"args": ["--spec-type=none", "-c", "8192"]}, "off", ""),
        ({"flags": ["-md", "draft.gguf"]}, "on", ""),
        # Every spelling of a draft model llama-server accepts (kb.domain.flags, shared with
        # triage.stackfile): the current long names were read as "off" before.
        ({"args": ["--spec-draft-model", "draft.gguf"]}, "on", ""),
        ({"args": ["--spec-draft-model=draft.gguf"]}, "on", ""),
        ({"args": ["-hfrd", "org/draft-GGUF"]}, "on", ""),
        ({"args": ["--spec-type", "none", "--spec-draft-n-max", "8"]}, "off", ""),
        ({"args": "-c 8192 --reasoning off"}, "off", "off"),
        ({"args": ["--reasoning", "on"]}, "off", "on"),
        ({"args": ["--reasoning-budget", "0"]}, "off", "off"),
        ({"args": ["--chat-template-kwargs", '{"enable_thinking": false}']}, "off", "off"),
        ({"args": []}, "", ""),
        ({"speculative": "draft-MTP speculative decoding, added 2026-06-10"}, "on", ""),
        ({"speculative": False, "thinking_default": True}, "off", "on"),
        ({"thinking_default": "on: the template enables thinking unless told"}, "", "on"),
        ({"thinking_default": "not recorded"}, "", ""),
    ],
)
def test_spec_and_thinking(stack: dict[str, Any], spec: str, thinking: str) -> None:
    fingerprint = stack_fingerprint(stack)
    assert (fingerprint["spec"], fingerprint["thinking"]) == (spec, thinking)


def test_family_and_the_spec_off_arm_read_one_flag_vocabulary() -> None:
    """What kb.repo.family calls speculative decoding is what the spec-off arm strips."""
    from triage import stackfile

    assert stackfile.SPEC_VALUE_FLAGS is flags.SPEC_VALUE_FLAGS
    for flag in sorted(flags.DRAFT_MODEL_FLAGS):
        args = ["-c", "8192", flag, "draft.gguf"]
        assert stack_fingerprint({"args": args})["spec"] == "on", flag
        assert stackfile.has_spec_flags(args), flag
        assert stackfile.strip_spec_flags(args) == ["-c", "8192"], flag


def test_findings_that_name_a_mechanism_imply_a_registered_cause() -> None:
    from kb.domain.family import IMPLIED_CAUSES
    from triage.catalogue import catalogue

    for kind, cause in IMPLIED_CAUSES.items():
        assert kind in catalogue().checks and cause in catalogue().causes, (kind, cause)
    leak = Signature(kinds=frozenset({"reasoning-markup-in-content", "empty-content"}))
    assert leak.compared_causes() == {"reasoning-leak"}
    lost = Signature(kinds=frozenset({"client-lost-reply"}), causes=frozenset({"token-limit"}))
    assert lost.compared_causes() == {"token-limit"}  # a confirmed cause wins over implied


def test_similarity_is_a_weighted_jaccard_over_what_the_query_knows() -> None:
    a = signature({"empty-content", "length-stop"}, {"token-limit"}, {"model": "qwen3.gguf"})
    assert similarity(a, a) == 1.0
    assert similarity(a, Signature()) == 0.0
    # Shared: one kind (1.0) of kinds 2 + 1 = 3 in the union, plus the family (0.5) of
    # 0.5; causes 2.0 on one side only.  (1.0 + 0.5) / (3.0 + 0.5 + 2.0)
    b = signature({"empty-content", "timeout"}, set(), {"model": "qwen2.gguf"})
    assert similarity(a, b) == pytest.approx(1.5 / 5.5)  # weights 4 : 2 : 8 = 1 : 0.5 : 2
    # The query knows no fingerprint: the past incident's stack is not compared at all.
    bare = signature({"empty-content"}, set(), {})
    assert similarity(bare, signature({"empty-content"}, set(), {"model": "gemma.gguf"})) == 1.0
    # A fresh capture's mechanism finding stands in for its cause.
    capture = signature({"reasoning-exhausted-budget"}, set(), {})
    assert capture.compared_causes() == {"reasoning-exhausts-budget"}
    past = signature({"slow-response"}, {"reasoning-exhausts-budget"}, {})
    assert similarity(capture, past) == pytest.approx(2.0 / 4.0)


# ------------------------------------------------------------------ stored signatures


def _all_signatures(session: Any) -> dict[int, Signature]:
    from kb.repo.family import _computed

    ids = list(session.exec(select(Incident.id)).all())
    return _computed(session, ids)


@pytest.mark.parametrize("refresh", [False, True], ids=["stale", "fresh"])
def test_sql_and_python_scores_agree(family_store: Store, refresh: bool) -> None:
    queries = [
        signature(DRILL_KINDS, set(), DRILL_STACK),
        signature({"tool-args-invalid-json", "custom-kind"}, {"speculative-decoding"}, {}),
        signature({"timeout"}, {"my-own-cause"}, {"model": "mistral.gguf", "thinking": False}),
        signature(set(), {"token-limit"}, {"args": ["-md", "x.gguf"]}),
    ]
    with family_store.session() as session:
        if refresh:
            assert refresh_signatures(session) == 7
        stale = session.exec(
            select(IncidentSignature).where(IncidentSignature.stale == True)  # noqa: E712
        ).all()
        assert len(stale) == (0 if refresh else 7)
        stored = _all_signatures(session)
        slugs = dict(session.exec(select(Incident.slug, Incident.id)).all())
        for query in queries:
            matches = similar_incidents(session, query, limit=50, min_score=0.0)
            expected = {slug: round(similarity(query, stored[slugs[slug]]), 4) for slug in slugs}
            assert {m.slug: m.score for m in matches} == expected
            assert [m.score for m in matches] == sorted((m.score for m in matches), reverse=True)


def test_changed_symptoms_make_the_signature_stale_and_matches_follow(
    family_store: Store,
) -> None:
    with family_store.session() as session:
        refresh_signatures(session)
        timeouts = signature({"timeout"}, set(), {})
        assert similar_incidents(session, timeouts)[0].slug == "2026-04-01-mistral-timeouts"
        phi = session.exec(select(Incident).where(Incident.slug == "2026-05-28-phi-length")).one()
        session.add(Symptom(incident_id=phi.id, key="S9", kind="timeout", description="also"))
        session.flush()
        row = session.get(IncidentSignature, phi.id)
        assert row is not None and row.stale
        # Scored from the live rows before any refresh.
        assert {m.slug for m in similar_incidents(session, timeouts)} >= {"2026-05-28-phi-length"}
        assert refresh_signatures(session) == 1
        session.refresh(row)
        assert not row.stale and "timeout" in row.kinds.split(",")


# ------------------------------------------------------------------ the Qwen family


def test_qwen_incidents_are_the_family_of_a_new_drill_capture(family_store: Store) -> None:
    with family_store.session() as session:
        refresh_signatures(session)
        matches = similar_incidents(session, signature(DRILL_KINDS, set(), DRILL_STACK))
    assert {m.slug for m in matches[:2]} == set(QWEN)
    for match in matches[:2]:
        assert set(match.shared_kinds) == DRILL_KINDS
        assert match.shared_causes == ["reasoning-exhausts-budget"]
        assert match.model_family == "qwen"
    assert REFERENCE in [m.slug for m in matches]
    assert "2026-04-01-mistral-timeouts" not in [m.slug for m in matches]


def test_imported_qwen_incidents_are_the_family_of_a_new_drill_capture(store: Store) -> None:
    from kb.repo.files import import_paths
    from triage.symptoms import failure_kinds

    import_paths(store, [INCIDENTS_DIR])
    qwen = {path.stem for path in INCIDENTS_DIR.glob("*qwen*.md")}
    # The greedy request of the thinking-budget drill, as llama-server answers it.
    kinds = failure_kinds(
        {
            "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 800},
            "response": {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {
                            "role": "assistant",
                            "content": "",
                            "reasoning_content": "the harbour is calm " * 240,
                        },
                    }
                ],
                "usage": {"completion_tokens": 800, "prompt_tokens": 12},
            },
            "status": 200,
        }
    )
    assert {"empty-content", "length-stop"} <= kinds
    with store.session() as session:
        matches = similar_incidents(session, signature(kinds, set(), DRILL_STACK))
        assert qwen <= {m.slug for m in matches}
        for match in matches:
            if match.slug in qwen:
                assert "reasoning-exhausts-budget" in match.shared_causes
        # From the reference incident, the Qwen incidents are its family and already linked.
        linked = similar_incidents(
            session, incident_signature(session, REFERENCE), exclude_slug=REFERENCE
        )
        assert {m.slug for m in linked if m.linked} >= qwen


def test_exclude_slug_and_min_score(family_store: Store) -> None:
    with family_store.session() as session:
        query = incident_signature(session, QWEN[0])
        matches = similar_incidents(session, query, exclude_slug=QWEN[0])
        assert QWEN[0] not in [m.slug for m in matches]
        assert matches[0].slug == QWEN[1] and matches[0].score == 1.0
        assert similar_incidents(session, query, min_score=1.0, exclude_slug=QWEN[0]) == [
            matches[0]
        ]
        assert similar_incidents(session, Signature()) == []
        with pytest.raises(StoreError):
            similar_incidents(session, query, exclude_slug="2026-01-01-nope")


# ------------------------------------------------------------------ family links


def test_link_family_records_one_undirected_link(family_store: Store) -> None:
    with family_store.session() as session:
        link = link_family(
            session,
            REFERENCE,
            "reasoning-exhausts-budget",
            QWEN[0],
            "reasoning-exhausts-budget",
            "same stack, different model",
        )
        again = link_family(
            session, QWEN[0], "reasoning-exhausts-budget", REFERENCE, "reasoning-exhausts-budget"
        )
        assert again.id == link.id and again.note == "same stack, different model"
        assert len(session.exec(select(FamilyLink)).all()) == 1
        matches = similar_incidents(
            session, incident_signature(session, REFERENCE), exclude_slug=REFERENCE
        )
        assert {m.slug for m in matches if m.linked} == {QWEN[0]}

        with pytest.raises(StoreError, match="two different incidents"):
            link_family(session, QWEN[0], "reasoning-exhausts-budget", QWEN[0], "x")
        with pytest.raises(StoreError, match="no cause"):
            link_family(session, REFERENCE, "token-limit", QWEN[1], "reasoning-exhausts-budget")
        with pytest.raises(StoreError, match="no incident"):
            link_family(session, REFERENCE, "quantized-weights", "2026-01-01-nope", "x")


def test_link_family_finds_a_cause_by_catalogue_id_unless_ambiguous(store: Store) -> None:
    from kb.models import Cause

    with store.session() as session:
        two = add_incident(session, "2026-08-01-two", "two refinements of one cause")
        one = add_incident(session, "2026-08-02-one", "one refinement")
        for incident, keys in ((two, ("budget-a", "budget-b")), (one, ("budget-c",))):
            for key in keys:
                session.add(
                    Cause(
                        incident_id=incident.id,
                        key=key,
                        catalogue_id="reasoning-exhausts-budget",
                        title=key,
                        status="confirmed",
                    )
                )
        session.flush()
        link = link_family(
            session, "2026-08-01-two", "budget-b", "2026-08-02-one", "reasoning-exhausts-budget"
        )
        assert link.id is not None
        with pytest.raises(StoreError, match="ambiguous"):
            link_family(
                session,
                "2026-08-01-two",
                "reasoning-exhausts-budget",
                "2026-08-02-one",
                "budget-c",
            )


# ------------------------------------------------------------------ the command line

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "real"


def _cli(store: Store, *args: str) -> Any:
    from click.testing import CliRunner

    from triage.cli import cli

    result = CliRunner().invoke(cli, ["--database", store.url, *args], catch_exceptions=False)
    return result


def test_family_command_on_a_real_drill_capture_lists_the_qwen_incidents(store: Store) -> None:
    import json

    from kb.repo.files import import_paths

    import_paths(store, [INCIDENTS_DIR])
    result = _cli(store, "family", str(CAPTURES / "budget-greedy.response.json"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"empty-content", "length-stop", "reasoning-exhausted-budget"} <= set(data["findings"])
    assert data["signature"]["model_family"] == "gemma"
    assert data["signature"]["server_build"] == "11434"
    assert data["implied_causes"] == ["reasoning-exhausts-budget"]
    slugs = [match["slug"] for match in data["matches"]]
    assert {path.stem for path in INCIDENTS_DIR.glob("*qwen*.md")} <= set(slugs)
    assert REFERENCE in slugs


def test_family_command_links_matches_that_share_a_confirmed_cause(family_store: Store) -> None:
    import json

    result = _cli(family_store, "family", REFERENCE, "--link", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    made = {(link["to"], link["cause"]) for link in data["links_made"]}
    assert made == {(slug, "reasoning-exhausts-budget") for slug in QWEN}
    assert all(m["linked"] for m in data["matches"] if m["slug"] in QWEN)
    again = _cli(family_store, "family", REFERENCE, "--link")
    assert again.exit_code == 0, again.output
    assert "no new family links" in again.output
    with family_store.session(readonly=True) as session:
        assert len(session.exec(select(FamilyLink)).all()) == 2

    human = _cli(family_store, "family", REFERENCE)
    assert "[linked]" in human.output and QWEN[0] in human.output
    missing = _cli(family_store, "family", "2026-01-01-nope")
    assert missing.exit_code != 0 and "neither a stored incident nor a file" in missing.output
