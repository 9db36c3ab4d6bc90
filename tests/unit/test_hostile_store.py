"""Issue 18 (6, 8): evidence keys numbered per transaction and unique under concurrency,
database errors as one line, unsupported database URLs refused by name."""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import event, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from kb.domain.errors import StoreError
from kb.models import Evidence, Incident
from kb.repo.engine import describe_db_error
from kb.repo.files import import_paths
from kb.repo.store import (
    EvidenceItem,
    Store,
    add_evidence,
    add_evidence_many,
    allocate_evidence_keys,
    next_evidence_key,
)
from triage.cli import cli

CAPTURES = 8
EXCHANGES = 10


def _evidence_scans(store: Store) -> list[str]:
    """Every SELECT on the evidence table's keys the store runs from now on."""
    seen: list[str] = []

    def listener(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        flat = statement.replace('"', "")
        if flat.lstrip().upper().startswith("SELECT") and "evidence.key" in flat:
            seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", listener)
    return seen


def test_keys_are_scanned_once_per_transaction_not_once_per_row(store: Store) -> None:
    with store.session() as session:
        for number in range(3):
            add_evidence(session, incident_id=None, kind="exchange", summary=f"old {number}")
    scans = _evidence_scans(store)
    with store.session() as session:
        keys = [
            add_evidence(session, incident_id=None, kind="exchange", summary=f"row {n}").key
            for n in range(200)
        ]
    assert keys == [f"E{n}" for n in range(4, 204)]
    assert len(scans) == 1
    with store.session() as session:
        assert allocate_evidence_keys(session, None, 3) == ["E204", "E205", "E206"]
        # Nothing was stored with those keys: a later transaction numbers from the rows.
    with store.session() as session:
        assert next_evidence_key(session, None) == "E204"


def test_explicit_keys_move_the_numbering_past_them(store: Store) -> None:
    with store.session() as session:
        incident = Incident(slug="2026-07-01-keys", title="keys", opened_on=date(2026, 7, 1))
        session.add(incident)
        session.flush()
        first = add_evidence(session, incident_id=incident.id, kind="log", summary="auto")
        add_evidence(session, incident_id=incident.id, kind="log", summary="given", key="E7")
        after = add_evidence(session, incident_id=incident.id, kind="log", summary="auto")
        (batch,) = add_evidence_many(session, incident.id, [EvidenceItem("log", "b")])
    assert (first.key, after.key, batch.key) == ("E1", "E8", "E9")


def _capture(store: Store, barrier: threading.Barrier, errors: list[BaseException]) -> None:
    try:
        barrier.wait(timeout=60)
        with store.session() as session:
            for number in range(EXCHANGES):
                add_evidence(
                    session, incident_id=None, kind="exchange", summary=f"exchange {number}"
                )
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_parallel_captures_without_an_incident_get_distinct_keys(db_url: str) -> None:
    stores = [Store(db_url, migrate=index == 0) for index in range(CAPTURES)]
    try:
        barrier = threading.Barrier(CAPTURES)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_capture, args=(s, barrier, errors)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        with stores[0].session(readonly=True) as session:
            keys = session.exec(select(Evidence.key).where(Evidence.incident_id.is_(None))).all()
    finally:
        for kb_store in stores:
            kb_store.close()
    assert len(keys) == CAPTURES * EXCHANGES
    assert len(set(keys)) == CAPTURES * EXCHANGES


def test_integrity_error_is_one_line_without_sql_or_parameters(store: Store) -> None:
    secret_title = "title-with-a-parameter-value-9f3a"
    with store.session() as session:
        session.add(Incident(slug="2026-07-01-dup", title="x", opened_on=date(2026, 7, 1)))
    with pytest.raises(IntegrityError) as caught:
        with store.session() as session:
            session.add(
                Incident(slug="2026-07-01-dup", title=secret_title, opened_on=date(2026, 7, 1))
            )
    line = describe_db_error(caught.value)
    assert "\n" not in line
    assert "IntegrityError" in line or "UniqueViolation" in line
    assert "INSERT" not in line.upper() and secret_title not in line and "[SQL" not in line


def _incident_file(directory: Path, slug: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{slug}.md"
    path.write_text(
        f"---\nslug: {slug}\ntitle: Parallel\nstatus: open\nopened: {slug[:10]}\n---\n",
        encoding="utf-8",
    )
    return path


def test_the_losing_parallel_import_gets_one_clear_line(db_url: str, tmp_path: Path) -> None:
    path = _incident_file(tmp_path / "in", "2026-07-01-parallel")
    stores = [Store(db_url, migrate=index == 0) for index in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[Any] = []

    def run(kb_store: Store) -> None:
        barrier.wait(timeout=60)
        try:
            outcomes.append(import_paths(kb_store, [path]))
        except StoreError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for kb_store in stores:
            kb_store.close()
    # Either the loser collides with the winner's insert (one clear line), or -- since an
    # import re-run skips what the same file already stored -- it starts after the winner
    # committed and imports nothing. Never two copies, never a traceback.
    errors = [o for o in outcomes if isinstance(o, StoreError)]
    imported = sorted(o for o in outcomes if isinstance(o, list))
    assert len(outcomes) == 2
    if errors:
        assert imported == [["2026-07-01-parallel"]]
        text = str(errors[0])
        assert "\n" not in text and "INSERT" not in text.upper() and "[SQL" not in text
        assert "2026-07-01-parallel" in text or "same incident" in text
    else:
        assert imported == [[], ["2026-07-01-parallel"]]
    reader = Store(db_url, migrate=False)
    try:
        with reader.session() as session:
            slugs = session.exec(select(Incident.slug)).all()
    finally:
        reader.close()
    assert slugs == ["2026-07-01-parallel"]


def test_unsupported_database_url_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as caught:
        Store("mysql://root@127.0.0.1/triage")
    assert str(caught.value) == (
        "unsupported database URL scheme 'mysql': use sqlite or postgresql+psycopg"
    )
    result = CliRunner().invoke(
        cli,
        ["--database", "mysql://root:hunter2@127.0.0.1/triage", "incidents", "list"],
        env={"TRIAGE_HOME": str(tmp_path)},
    )
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert lines == [
        "Error: cannot open the knowledge base: unsupported database URL scheme 'mysql': "
        "use sqlite or postgresql+psycopg"
    ]


def test_unreachable_database_is_one_line_in_the_cli(tmp_path: Path) -> None:
    url = "postgresql+psycopg://triage:hunter2@127.0.0.1:1/triage?connect_timeout=2"
    result = CliRunner().invoke(
        cli, ["--database", url, "incidents", "list"], env={"TRIAGE_HOME": str(tmp_path)}
    )
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: cannot open the knowledge base postgresql+psycopg://triage:***@")
    assert "hunter2" not in line and "OperationalError" in line


def test_count_helper_sees_every_row(store: Store) -> None:
    # The per-transaction numbering must not hide rows from plain queries.
    with store.session() as session:
        add_evidence_many(session, None, [EvidenceItem("log", "a")] * 3)
    with store.session(readonly=True) as session:
        assert session.exec(select(func.count()).select_from(Evidence)).one() == 3


def test_numbering_is_not_reused_across_transactions_of_one_session(store: Store) -> None:
    from sqlmodel import Session

    with Session(store.engine) as session:  # autobegin, commit, autobegin again
        first = add_evidence(session, incident_id=None, kind="log", summary="first").key
        session.commit()
        with store.session() as other:
            add_evidence(other, incident_id=None, kind="log", summary="another writer")
        later = add_evidence(session, incident_id=None, kind="log", summary="later").key
        session.commit()
    assert (first, later) == ("E1", "E3")
