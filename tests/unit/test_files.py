"""Incident files <-> store: schema, canonical YAML, byte round trip, every bad-input case."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from sqlalchemy import func
from sqlmodel import SQLModel, select

import kb.repo.files as files
from kb.domain.errors import StoreError
from kb.models import (
    CAUSE_BASES,
    CAUSE_STATUSES,
    DECISION_KINDS,
    EVIDENCE_KINDS,
    INCIDENT_STATUSES,
    LINK_RELATIONS,
    Cause,
    CauseStatusChange,
)
from kb.repo.fileparse import SCHEMA_PATH, parse_file, parse_text, split_front_matter
from kb.repo.files import (
    RecordError,
    dump_yaml,
    export_all,
    export_incident,
    import_paths,
    list_records,
    load_record,
    load_yaml,
    render_record,
)
from kb.repo.store import Store, add_evidence, get_incident, record_status_change
from triage.catalogue import catalogue

# The catalogue's full list of cause ids, passed in as triage's import does (kb has none).
CAUSE_CATALOGUE_IDS = catalogue().causes.ids()

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
COMMITTED = sorted(INCIDENTS.glob("*.md"))


def _counts(store: Store) -> dict[str, int]:
    """Rows per table: the whole database's state for 'unchanged' checks."""
    with store.session(readonly=True) as session:
        return {
            table.name: session.exec(select(func.count()).select_from(table)).one()
            for table in SQLModel.metadata.sorted_tables
        }


def _minimal(slug: str = "2026-07-01-minimal") -> dict[str, Any]:
    """A small valid record exercising every list."""
    return {
        "slug": slug,
        "title": "Minimal incident",
        "status": "open",
        "opened": slug[:10],
        "stack": {"model": "m", "flags": ["--jinja"], "speculative": "off"},
        "timeline": [{"at": slug[:10], "event": "started", "evidence": ["E1"]}],
        "symptoms": [{"id": "S1", "description": "empty content", "evidence": ["E1"]}],
        "evidence": [
            {
                "id": "E1",
                "kind": "measurement",
                "summary": "content_len=0",
                "recorded_at": slug[:10],
            },
            {"id": "E2", "kind": "probe", "summary": "thinking off", "recorded_at": slug[:10]},
        ],
        "causes": [
            {
                "id": "reasoning-exhausts-budget",
                "catalogue": "reasoning-exhausts-budget",
                "title": "reasoning eats the budget",
                "status": "confirmed",
                "basis": "measured",
                "evidence": [{"id": "E1", "relation": "supports"}],
                "history": [
                    {
                        "to": "suspected",
                        "at": slug[:10],
                        "actor": "engine",
                        "rationale": "finding",
                    },
                    {
                        "from": "suspected",
                        "to": "confirmed",
                        "at": f"{slug[:10]}T10:00:00Z",
                        "actor": "engine",
                        "rationale": "thinking-off fixes it",
                        "evidence": ["E2"],
                    },
                ],
            }
        ],
        "decisions": [
            {
                "kind": "PARKED",
                "at": slug[:10],
                "rationale": "non-core",
                "verified": False,
                "revisit_on": "2026-09-01",
                "triggers": [{"kind": "new-build"}, {"kind": "date", "on": "2026-09-01"}],
            }
        ],
        "references": [{"url": "https://example.org/x", "title": "x"}],
        "body": "\n# Minimal\n\nNarrative.\n",
    }


def _write(directory: Path, record: dict[str, Any], name: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or record['slug']}.md"
    # Every key, in the record's order (render_record would drop unknown keys).
    front = {key: value for key, value in record.items() if key != "body"}
    text = f"---\n{dump_yaml(front)}---\n{record.get('body', '')}"
    path.write_bytes(text.encode("utf-8"))
    return path


# --------------------------------------------------------------------------- schema + YAML


def test_schema_is_valid_2020_12_and_matches_the_model_constants() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    defs = schema["$defs"]
    assert tuple(schema["properties"]["status"]["enum"]) == INCIDENT_STATUSES
    # Catalogue ids and trigger kinds are open vocabularies (plugins add their own): the
    # schema takes any id of the catalogue's shape, and every built-in one has that shape.
    catalogue_id = defs["cause"]["properties"]["catalogue"]["pattern"]
    assert all(re.fullmatch(catalogue_id, cause) for cause in CAUSE_CATALOGUE_IDS)
    assert re.fullmatch(catalogue_id, "vendor-plugin-cause")
    trigger_kind = defs["trigger"]["properties"]["kind"]["pattern"]
    assert all(re.fullmatch(trigger_kind, k) for k in ("new-build", "failure-rate", "vendor-kind"))
    assert not re.fullmatch(trigger_kind, "Not A Kind")
    assert tuple(defs["cause"]["properties"]["status"]["enum"]) == CAUSE_STATUSES
    assert tuple(defs["cause"]["properties"]["basis"]["enum"]) == CAUSE_BASES
    assert tuple(defs["evidence"]["properties"]["kind"]["enum"]) == EVIDENCE_KINDS
    assert tuple(defs["evidence_link"]["properties"]["relation"]["enum"]) == LINK_RELATIONS
    assert tuple(defs["decision"]["properties"]["kind"]["enum"]) == DECISION_KINDS
    assert tuple(schema["properties"]) == files.INCIDENT_KEYS


def test_yaml_keeps_dates_as_strings_and_writes_them_plain() -> None:
    data = load_yaml("a: 2026-06-10\nb: 2026-06-10T01:02:03Z\nc: !!timestamp 2026-06-10\n")
    assert data == {"a": "2026-06-10", "b": "2026-06-10T01:02:03Z", "c": "2026-06-10"}
    assert dump_yaml({"a": "2026-06-10"}) == "a: 2026-06-10\n"
    # Strings that YAML 1.1 would read as other types stay quoted.
    for text in ("off", "yes", "null", "1.5", "9586", "~"):
        assert load_yaml(dump_yaml({"k": text})) == {"k": text}


def test_yaml_refuses_duplicate_keys_and_unsafe_tags() -> None:
    with pytest.raises(yaml.YAMLError, match="duplicate key"):
        load_yaml("a: 1\na: 2\n")
    with pytest.raises(yaml.YAMLError):
        load_yaml("a: !!python/object:os.system {}\n")


def test_yaml_multiline_strings_are_literal_blocks_and_no_aliases() -> None:
    shared = ["x"]
    text = dump_yaml({"a": "line one\nline two\n", "b": shared, "c": shared})
    assert "a: |\n  line one\n  line two\n" in text
    assert "&" not in text and "*" not in text


def test_timestamps_normalise_to_utc() -> None:
    assert files.format_timestamp(files.parse_timestamp("2026-06-10")) == "2026-06-10"
    assert (
        files.format_timestamp(files.parse_timestamp("2026-06-10T09:30:00+09:00"))
        == "2026-06-10T00:30:00Z"
    )
    assert (
        files.format_timestamp(files.parse_timestamp("2026-06-10T00:00:00.250000Z"))
        == "2026-06-10T00:00:00.250000Z"
    )


# --------------------------------------------------------------------------- round trip


def test_committed_files_exist() -> None:
    names = {path.name for path in COMMITTED}
    assert "2026-06-10-gemma4-empty-response.md" in names
    assert len([n for n in names if "qwen" in n]) == 2


def test_import_then_export_reproduces_the_committed_files_byte_for_byte(
    store: Store, tmp_path: Path
) -> None:
    slugs = import_paths(store, [INCIDENTS])
    assert slugs == [path.stem for path in COMMITTED]
    written = export_all(store, tmp_path / "out")
    assert [p.name for p in written] == [p.name for p in COMMITTED]
    for original, exported in zip(COMMITTED, written, strict=True):
        assert exported.read_bytes() == original.read_bytes(), original.name


def test_export_incident_writes_one_file(store: Store, tmp_path: Path) -> None:
    import_paths(store, [INCIDENTS])
    path = export_incident(store, "2026-06-10-gemma4-empty-response", tmp_path)
    assert path.read_bytes() == (INCIDENTS / path.name).read_bytes()
    with pytest.raises(StoreError, match="no incident"):
        export_incident(store, "2026-01-01-nope", tmp_path)


def test_minimal_record_round_trips_through_the_store(store: Store, tmp_path: Path) -> None:
    record = _minimal()
    path = _write(tmp_path / "in", record)
    import_paths(store, [path])
    with store.session(readonly=True) as session:
        loaded = load_record(session, record["slug"])
    assert loaded == record
    (out,) = export_all(store, tmp_path / "out")
    # Export adds the generated retrospective (the record has a decision) and moves replay
    # evidence (kind probe) to the sidecar; re-reading the exported file and its sidecar
    # gives the same record back, and the canonical text is what was written.
    front = {**record, "evidence": [e for e in record["evidence"] if e["kind"] != "probe"]}
    assert out.read_bytes() == render_record(record, front=front).encode("utf-8")
    assert out.with_name(f"{record['slug']}.evidence.jsonl").is_file()
    assert parse_file(out) == record


def test_non_canonical_file_reaches_a_fixed_point(store: Store, tmp_path: Path) -> None:
    """Flow lists, offsets, empty optional keys and a missing history are canonicalised once."""
    text = (
        "---\n"
        "slug: 2026-07-02-loose\n"
        "title: Loose\n"
        "status: open\n"
        "opened: 2026-07-02\n"
        "closed: null\n"
        'summary: ""\n'
        "timeline: []\n"
        "evidence: [{id: E1, kind: log, summary: s, recorded_at: '2026-07-02T10:30:00+09:00'}]\n"
        "causes:\n"
        "- {id: token-limit, title: t, status: suspected, basis: untested,"
        " evidence: [{id: E1, relation: context}]}\n"
        "decisions: [{kind: FIXED, at: 2026-07-03, rationale: r, fix: f}]\n"
        "---\n"
        "body\n"
    )
    source = tmp_path / "in" / "2026-07-02-loose.md"
    source.parent.mkdir()
    source.write_text(text, encoding="utf-8")
    import_paths(store, [source])
    (first,) = export_all(store, tmp_path / "a")
    exported = first.read_text(encoding="utf-8")
    front = load_yaml(split_front_matter(exported, "x")[0])
    assert not {"closed", "summary", "timeline"} & set(front)
    assert "recorded_at: 2026-07-02T01:30:00Z" in exported
    assert "catalogue: token-limit" in exported
    assert "verified: false" in exported
    assert "actor: import" in exported and "2026-07-02-loose.md" in exported

    with store.session(readonly=True) as session:
        cause = session.exec(select(Cause).where(Cause.key == "token-limit")).one()
        history = session.exec(
            select(CauseStatusChange).where(CauseStatusChange.cause_id == cause.id)
        ).all()
    assert [(h.from_status, h.to_status, h.actor) for h in history] == [
        (None, "suspected", "import")
    ]

    other = Store(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        import_paths(other, [first])
        (second,) = export_all(other, tmp_path / "b")
    finally:
        other.close()
    assert second.read_bytes() == first.read_bytes()


def test_history_is_imported_in_order_and_ends_at_the_status(store: Store) -> None:
    import_paths(store, [INCIDENTS])
    with store.session(readonly=True) as session:
        cause = session.exec(select(Cause).where(Cause.key == "quantized-weights")).one()
        history = session.exec(
            select(CauseStatusChange)
            .where(CauseStatusChange.cause_id == cause.id)
            .order_by(CauseStatusChange.id)  # type: ignore[arg-type]
        ).all()
    assert [(h.from_status, h.to_status) for h in history] == [
        (None, "suspected"),
        ("suspected", "rejected"),
    ]
    assert history[-1].evidence_keys == ["E6", "E7"]
    assert cause.status == "rejected"


def test_family_links_resolve_within_the_batch_and_against_the_database(
    store: Store, tmp_path: Path
) -> None:
    first = _minimal("2026-07-01-first")
    second = _minimal("2026-07-05-second")
    second["family"] = [
        {
            "cause": "reasoning-exhausts-budget",
            "incident": "2026-07-01-first",
            "other_cause": "reasoning-exhausts-budget",
            "note": "same family",
        }
    ]
    import_paths(store, [_write(tmp_path / "a", first)])
    import_paths(store, [_write(tmp_path / "b", second)])  # target already stored
    with store.session(readonly=True) as session:
        assert load_record(session, second["slug"])["family"] == second["family"]
        assert "family" not in load_record(session, first["slug"])


def test_rows_written_by_the_engine_export_and_reimport(store: Store, tmp_path: Path) -> None:
    """Evidence and status changes added through the store helpers survive export/import."""
    slug = "2026-07-01-minimal"
    import_paths(store, [_write(tmp_path / "in", _minimal(slug))])
    with store.session() as session:
        incident = get_incident(session, slug)
        assert incident is not None
        probe = add_evidence(
            session,
            incident_id=incident.id,
            kind="probe",
            summary="spec-off: 0 failures in 20",
            payload={"n": 20, "failures": 0},
        )
        assert probe.key == "E3"
        cause = Cause(
            incident_id=incident.id,
            key="speculative-decoding",
            catalogue_id="speculative-decoding",
            title="speculative decoding",
            status="suspected",
        )
        record_status_change(session, cause, "suspected", actor="engine", rationale="planned")
        record_status_change(
            session, cause, "rejected", actor="engine", rationale="no change", evidence_keys=["E3"]
        )
    (first,) = export_all(store, tmp_path / "a")
    record = parse_file(first)  # the probes are in its evidence sidecar
    added = record["causes"][1]
    assert [h.get("from") for h in added["history"]] == [None, "suspected"]
    assert added["history"][1]["at"].endswith("Z")
    other = Store(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        import_paths(other, [first])
        (second,) = export_all(other, tmp_path / "b")
    finally:
        other.close()
    assert second.read_bytes() == first.read_bytes()


def test_export_refuses_stored_rows_that_import_would_refuse(store: Store, tmp_path: Path) -> None:
    slug = "2026-07-01-minimal"
    import_paths(store, [_write(tmp_path / "in", _minimal(slug))])
    with store.session() as session:
        incident = get_incident(session, slug)
        assert incident is not None
        session.add(
            Cause(
                incident_id=incident.id,
                key="gremlins",
                catalogue_id="Gremlins!",  # not a catalogue id shape
                title="not a catalogue cause",
                status="suspected",
            )
        )
    out = tmp_path / "out"
    with pytest.raises(RecordError) as caught:
        export_all(store, out)
    assert caught.value.file == str(out / f"{slug}.md")
    assert caught.value.json_path == "$.causes[1].catalogue"
    assert not out.exists()


def test_dry_run_validates_and_stores_nothing(store: Store) -> None:
    before = _counts(store)
    assert import_paths(store, [INCIDENTS], dry_run=True)
    assert _counts(store) == before
    assert import_paths(store, [INCIDENTS])  # and the real import still works


def test_list_records_filters(store: Store) -> None:
    import_paths(store, [INCIDENTS])
    with store.session(readonly=True) as session:
        everything = list_records(session)
        parked = list_records(session, status="parked")
        rejected = list_records(session, cause="quantized-weights", cause_status="rejected")
        gemma = list_records(session, model="Gemma")
        none = list_records(session, cause="token-limit")
    assert [r["slug"] for r in everything] == [p.stem for p in COMMITTED]
    assert [r["slug"] for r in parked] == ["2026-06-10-gemma4-empty-response"]
    assert [r["slug"] for r in rejected] == ["2026-06-10-gemma4-empty-response"]
    assert [r["slug"] for r in gemma] == ["2026-06-10-gemma4-empty-response"]
    assert none == []
    assert parked[0]["decision"] == "PARKED"


def test_directories_and_files_are_expanded_sorted_and_deduplicated(tmp_path: Path) -> None:
    _write(tmp_path, _minimal("2026-07-02-b"))
    _write(tmp_path, _minimal("2026-07-01-a"))
    (tmp_path / "notes.txt").write_text("ignored", encoding="utf-8")
    paths = files.incident_paths([tmp_path, tmp_path / "2026-07-01-a.md"])
    assert [p.name for p in paths] == ["2026-07-01-a.md", "2026-07-02-b.md"]


# --------------------------------------------------------------------------- bad input


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(record: dict[str, Any]) -> None:
        target: Any = record
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return mutate


def _delete(path: list[str | int]) -> Callable[[dict[str, Any]], None]:
    def mutate(record: dict[str, Any]) -> None:
        target: Any = record
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return mutate


RECORD_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown incident status", _set(["status"], "solved"), "$.status", "solved"),
    ("unknown cause status", _set(["causes", 0, "status"], "maybe"), "$.causes[0].status", "maybe"),
    (
        "unknown cause id",
        lambda r: (r["causes"][0].update(id="gremlins"), r["causes"][0].pop("catalogue")),
        "$.causes[0].id",
        "unknown cause id 'gremlins'",
    ),
    (
        "unknown catalogue id",
        _set(["causes", 0, "catalogue"], "gremlins"),
        "$.causes[0].catalogue",
        "gremlins",
    ),
    (
        "evidence link to a missing id",
        _set(["causes", 0, "evidence", 0, "id"], "E9"),
        "$.causes[0].evidence[0].id",
        "no evidence with id 'E9'",
    ),
    (
        "symptom evidence to a missing id",
        _set(["symptoms", 0, "evidence"], ["E1", "E7"]),
        "$.symptoms[0].evidence[1]",
        "E7",
    ),
    (
        "history evidence to a missing id",
        _set(["causes", 0, "history", 1, "evidence"], ["E5"]),
        "$.causes[0].history[1].evidence[0]",
        "E5",
    ),
    ("wrong date", _set(["opened"], "2026-07-32"), "$.opened", "2026-07-32"),
    ("wrong closed date", _set(["closed"], "2026-06-30"), "$.closed", "before opened"),
    (
        "wrong timestamp",
        _set(["causes", 0, "history", 1, "at"], "2026-07-01 10:00"),
        "$.causes[0].history[1].at",
        "2026-07-01 10:00",
    ),
    (
        "slug/date mismatch",
        _set(["opened"], "2026-07-02"),
        "$.slug",
        "does not match opened 2026-07-02",
    ),
    (
        "status differs from the last history entry",
        _set(["causes", 0, "status"], "rejected"),
        "$.causes[0].status",
        "last history entry",
    ),
    (
        "history out of sequence",
        _set(["causes", 0, "history", 1, "from"], "rejected"),
        "$.causes[0].history[1].from",
        "does not follow",
    ),
    (
        "duplicate evidence id",
        _set(["evidence", 1, "id"], "E1"),
        "$.evidence[1].id",
        "duplicate evidence id",
    ),
    ("missing title", _delete(["title"]), "$", "'title' is a required property"),
    ("blank title", _set(["title"], "   "), "$.title", "does not match"),
    ("unknown key", _set(["owner"], "me"), "$", "owner"),
    ("wrong type", _set(["stack", "flags"], "--jinja"), "$.stack.flags", "not of type 'array'"),
    (
        "family link to a missing incident",
        _set(
            ["family"],
            [
                {
                    "cause": "reasoning-exhausts-budget",
                    "incident": "2026-01-01-nowhere",
                    "other_cause": "reasoning-exhausts-budget",
                }
            ],
        ),
        "$.family[0].incident",
        "2026-01-01-nowhere",
    ),
    (
        "family link from a missing cause",
        _set(
            ["family"],
            [{"cause": "token-limit", "incident": "2026-01-01-x", "other_cause": "token-limit"}],
        ),
        "$.family[0].cause",
        "token-limit",
    ),
    (
        "date trigger without a date",
        _set(["decisions", 0, "triggers", 1], {"kind": "date"}),
        "$.decisions[0].triggers[1]",
        "'on' is a required property",
    ),
    (
        "non-finite number",
        _set(["evidence", 0, "payload"], {"rate": float("nan")}),
        "$.evidence[0].payload.rate",
        "finite",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "json_path", "fragment"),
    [case[1:] for case in RECORD_CASES],
    ids=[case[0] for case in RECORD_CASES],
)
def test_bad_record_names_file_and_field_and_changes_nothing(
    store: Store,
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], None],
    json_path: str,
    fragment: str,
) -> None:
    import_paths(store, [_write(tmp_path / "seed", _minimal("2026-06-01-already-there"))])
    before = _counts(store)
    good = _write(tmp_path / "batch", _minimal("2026-06-02-good"))
    record = _minimal()
    mutate(record)
    bad = _write(tmp_path / "batch", record, name="2026-07-01-minimal")
    with pytest.raises(RecordError) as caught:
        import_paths(store, [good, bad], causes=CAUSE_CATALOGUE_IDS)
    assert caught.value.file == str(bad)
    assert caught.value.json_path == json_path
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(f"{bad}: {json_path}: ")
    assert _counts(store) == before


TEXT_CASES: list[tuple[str, str, str, str]] = [
    ("no front matter", "# just markdown\n", "$", "must start with a '---' line"),
    ("unclosed front matter", "---\nslug: x\n", "$", "no closing '---'"),
    ("malformed YAML", "---\nslug: [unclosed\n---\n", "$", "invalid YAML front matter at line"),
    ("duplicate key", "---\nslug: a\nslug: b\n---\n", "$", "duplicate key 'slug'"),
    ("front matter not a mapping", "---\n- a\n- b\n---\n", "$", "must be a YAML mapping"),
    ("binary value", "---\nslug: !!binary aGVsbG8=\n---\n", "$.slug", "bytes"),
    ("non-string key", "---\n1: one\n---\n", "$", "must be a string"),
]


@pytest.mark.parametrize(
    ("text", "json_path", "fragment"),
    [case[1:] for case in TEXT_CASES],
    ids=[case[0] for case in TEXT_CASES],
)
def test_malformed_file_names_file_and_field_and_changes_nothing(
    store: Store, tmp_path: Path, text: str, json_path: str, fragment: str
) -> None:
    before = _counts(store)
    good = _write(tmp_path, _minimal("2026-06-02-good"))
    bad = tmp_path / "2026-07-01-bad.md"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(RecordError) as caught:
        import_paths(store, [good, bad])
    assert (caught.value.file, caught.value.json_path) == (str(bad), json_path)
    assert fragment in caught.value.message
    assert _counts(store) == before


def test_not_utf8_and_missing_path(store: Store, tmp_path: Path) -> None:
    bad = tmp_path / "2026-07-01-bad.md"
    bad.write_bytes(b"---\ntitle: \xff\n---\n")
    with pytest.raises(RecordError, match="not UTF-8"):
        import_paths(store, [bad])
    with pytest.raises(RecordError, match="no such file"):
        import_paths(store, [tmp_path / "missing.md"])


def test_slug_must_match_the_file_name(store: Store, tmp_path: Path) -> None:
    bad = _write(tmp_path, _minimal(), name="2026-07-01-other-name")
    with pytest.raises(RecordError) as caught:
        import_paths(store, [bad])
    assert caught.value.json_path == "$.slug"
    assert "file name" in caught.value.message


def test_duplicate_slug_in_the_batch(store: Store, tmp_path: Path) -> None:
    first = _write(tmp_path / "a", _minimal())
    second = _write(tmp_path / "b", _minimal())
    before = _counts(store)
    with pytest.raises(RecordError) as caught:
        import_paths(store, [first, second])
    assert (caught.value.file, caught.value.json_path) == (str(second), "$.slug")
    assert "duplicate slug" in caught.value.message
    assert _counts(store) == before


def test_duplicate_slug_in_the_database(store: Store, tmp_path: Path) -> None:
    import_paths(store, [_write(tmp_path / "a", _minimal())])
    before = _counts(store)
    good = _write(tmp_path / "b", _minimal("2026-06-02-good"))
    again = _write(tmp_path / "b", _minimal())
    with pytest.raises(RecordError) as caught:
        import_paths(store, [good, again])
    assert (caught.value.file, caught.value.json_path) == (str(again), "$.slug")
    assert "already stored" in caught.value.message
    assert _counts(store) == before


def test_failure_while_writing_rolls_back_the_whole_batch(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _counts(store)

    def explode(*_args: Any) -> None:
        raise StoreError("boom after the incident rows were written")

    monkeypatch.setattr(files, "_insert_family", explode)
    with pytest.raises(StoreError, match="boom"):
        import_paths(store, [INCIDENTS])
    assert _counts(store) == before


def test_record_error_is_a_store_error() -> None:
    error = RecordError("incidents/x.md", "$.causes[0].status", "bad")
    assert isinstance(error, StoreError)
    assert str(error) == "incidents/x.md: $.causes[0].status: bad"


def test_parse_text_without_a_file_name_skips_the_name_check() -> None:
    record = parse_text(render_record(_minimal()))
    assert record["body"] == _minimal()["body"]


# --------------------------------------------------------------------------- fuzzing

# Any text a person might paste: unicode, control characters, YAML syntax, HTML, newlines.
# NUL and lone surrogates are refused on import (PostgreSQL text cannot hold NUL).
TEXT = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=80
)
TRICKY = st.sampled_from(
    [
        "<script>alert(1)</script>",
        "---",
        "...",
        "- item",
        "key: value",
        "# not a comment",
        "'quoted'",
        '"double"',
        "|",
        ">",
        "&anchor *alias",
        "!!python/object",
        "off",
        "null",
        "2026-06-10",
        "1e3",
        " leading and trailing ",
        "line\n---\nafter",
        "tab\there",
        "crlf\r\nline",
        "\u2028\x85",
        "한국어 텍스트",
        "trailing newlines\n\n\n",
        "\n",
        "🙂",
        "<<",
        "=",
        "? key",
        "%TAG",
        "@at `tick`",
    ]
)
PIECE = st.one_of(TEXT, TRICKY)
FREE_TEXT = st.lists(PIECE, min_size=1, max_size=4).map("".join)
NON_BLANK = FREE_TEXT.filter(lambda s: s.strip() != "" and not s.isspace())


def _fuzzed(title: str, rationale: str, summary: str, body: str, payload_text: str) -> dict:
    record = _minimal()
    record["title"] = title
    record["summary"] = summary
    record["causes"][0]["rationale"] = rationale
    record["causes"][0]["history"][1]["rationale"] = rationale
    record["evidence"][0]["payload"] = {payload_text: payload_text, "list": [payload_text]}
    record["decisions"][0]["tradeoff"] = summary
    record["body"] = body
    if not summary:
        del record["summary"]
        del record["decisions"][0]["tradeoff"]
    return record


@settings(max_examples=300, deadline=None)
@given(title=NON_BLANK, rationale=NON_BLANK, summary=FREE_TEXT, body=FREE_TEXT, key=NON_BLANK)
def test_any_text_round_trips_through_the_file_format(
    title: str, rationale: str, summary: str, body: str, key: str
) -> None:
    record = _fuzzed(title, rationale, summary, body.replace("\r", ""), key)
    text = render_record(record)
    parsed = parse_text(text, "2026-07-01-minimal.md")
    assert parsed == record
    assert render_record(parsed) == text


@pytest.fixture(scope="module")
def fuzz_stores(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Two stores: import into the first, re-import the export into the second."""
    directory = tmp_path_factory.mktemp("fuzz")
    stores = (Store(f"sqlite:///{directory / 'a.db'}"), Store(f"sqlite:///{directory / 'b.db'}"))
    yield stores
    for kb_store in stores:
        kb_store.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(title=NON_BLANK, rationale=NON_BLANK, summary=FREE_TEXT, body=FREE_TEXT, key=NON_BLANK)
def test_any_text_round_trips_import_export_import(
    fuzz_stores: tuple[Store, Store],
    tmp_path_factory: pytest.TempPathFactory,
    title: str,
    rationale: str,
    summary: str,
    body: str,
    key: str,
) -> None:
    first_store, second_store = fuzz_stores
    directory = tmp_path_factory.mktemp("case")
    slug = f"2026-07-01-{directory.name.lower().replace('_', '-')}"
    record = _fuzzed(title, rationale, summary, body, key)
    record["slug"] = slug
    import_paths(first_store, [_write(directory / "in", record)])
    with first_store.session(readonly=True) as session:
        first = load_record(session, slug)
    path = export_incident(first_store, slug, directory / "out")
    import_paths(second_store, [path])
    with second_store.session(readonly=True) as session:
        second = load_record(session, slug)
    assert second == first
    again = export_incident(second_store, slug, directory / "again")
    assert again.read_bytes() == path.read_bytes()


def test_every_registered_cause_is_a_catalogue_cause_of_a_file(
    store: Store, tmp_path: Path
) -> None:
    """The file check takes the catalogue's full list (passed in), not a list kept in kb."""
    record = _minimal("2026-07-02-kv")
    record["causes"][0]["id"] = "kv-cache-quant"  # registered, not one of the first six
    del record["causes"][0]["catalogue"]
    assert import_paths(store, [_write(tmp_path / "ok", record)], causes=CAUSE_CATALOGUE_IDS) == [
        "2026-07-02-kv"
    ]
    record = _minimal("2026-07-03-kv")
    record["causes"][0].update(id="kv-cache-quant", catalogue="token-limit")
    with pytest.raises(RecordError, match="catalogue cause 'kv-cache-quant' cannot refine"):
        import_paths(store, [_write(tmp_path / "bad", record)], causes=CAUSE_CATALOGUE_IDS)
