"""Store faults (issue 27): processes racing to create a fresh knowledge base, evidence
deduplication on re-diagnosis, batched captures beside a reader, read-only knowledge bases."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from kb_openers import open_fresh
from sqlalchemy import func, inspect, text
from sqlmodel import select

from kb.models import Evidence, Incident
from kb.repo import runs
from kb.repo.migrate import current_revision, head_revision
from kb.repo.store import (
    EvidenceItem,
    ReadOnlyError,
    Store,
    add_evidence_many,
    open_incident,
    require_incident,
)
from triage.capture import load_file
from triage.cli import cli
from triage.engine.recorder import Recorder
from triage.symptoms import classify

OPENERS = 6


def test_processes_opening_a_fresh_kb_at_once_all_succeed(db_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(OPENERS)
    results = context.Queue()
    processes = [
        context.Process(target=open_fresh, args=(db_url, ready, results)) for _ in range(OPENERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert outcomes == ["ok"] * OPENERS, outcomes
    assert [process.exitcode for process in processes] == [0] * OPENERS
    store = Store(db_url, migrate=False)
    try:
        with store.engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            tables = set(inspect(conn).get_table_names())
    finally:
        store.close()
    assert [row[0] for row in versions] == [head_revision()]
    assert {"incident", "evidence", "cause"} <= tables


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _exchange_rows(store: Store, slug: str) -> list[str]:
    with store.session(readonly=True) as session:
        incident = require_incident(session, slug)
        rows = session.exec(
            select(Evidence.key).where(
                Evidence.incident_id == incident.id, Evidence.kind == "exchange"
            )
        ).all()
    return sorted(rows)


def _prepare(store: Store, slug: str | None, exchange: dict[str, Any], findings: Any) -> Recorder:
    recorder = Recorder(store, actor="test")
    recorder.prepare(
        slug,
        runs.NewIncident(model="m", kinds=["tool-args-invalid-json"]),
        [],
        exchange=exchange,
        findings=findings,
        plan={"request": exchange.get("request")},
    )
    return recorder


def test_rediagnosing_an_incident_does_not_store_its_exchange_again(
    store: Store, tmp_path: Path
) -> None:
    (loaded,) = load_file(FIXTURES / "tool-args-invalid-json.json")
    exchange = loaded.to_dict()
    findings = [f.record() for f in classify(loaded)]
    first = _prepare(store, None, exchange, findings)
    slug = first.incident_slug
    again = [_prepare(store, slug, exchange, findings) for _ in range(2)]
    assert _exchange_rows(store, slug) == ["E1"]
    assert [r.evidence_keys["exchange"] for r in (first, *again)] == ["E1"] * 3
    # A capture of the same file before a diagnosis is the same evidence too.
    result = CliRunner().invoke(
        cli,
        [
            "--database",
            store.url,
            "capture",
            "--incident",
            slug,
            str(FIXTURES / "tool-args-invalid-json.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "already stored" in result.output
    assert _exchange_rows(store, slug) == ["E1"]
    # A different exchange is still stored.
    changed = {**exchange, "status": 599}
    other = _prepare(store, slug, changed, findings)
    assert other.evidence_keys["exchange"] == "E2"
    assert _exchange_rows(store, slug) == ["E1", "E2"]


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--database", url, *args])


def _evidence_count(store: Store) -> int:
    with store.session(readonly=True) as session:
        return int(session.exec(select(func.count()).select_from(Evidence)).one())


def test_a_reader_succeeds_while_a_capture_holds_a_write_transaction(store: Store) -> None:
    with store.session() as session:
        open_incident(session, "Listed while a capture writes")
    writing, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            with store.session() as session:  # one batch of a capture, mid-transaction
                add_evidence_many(
                    session, None, [EvidenceItem("exchange", f"x{n}") for n in range(50)]
                )
                writing.set()
                release.wait(timeout=120)
        except BaseException as exc:  # reported by the test
            failures.append(exc)
            writing.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert writing.wait(timeout=60)
        listed = _cli(store.url, "incidents", "list")
        orphans = _cli(store.url, "capture", "--orphans")
    finally:
        release.set()
        thread.join(timeout=120)
    assert not failures, failures
    assert listed.exit_code == 0, listed.output
    assert "Listed while a capture writes" in listed.output
    # The writer's rows are not committed yet: the reader saw the state before them.
    assert orphans.exit_code == 0 and "no evidence without an incident" in orphans.output
    assert _evidence_count(store) == 50


CAPTURED = 400
BATCH = 10


def _many_exchanges(path: Path, count: int) -> Path:
    (line,) = (FIXTURES / "exchanges.jsonl").read_text(encoding="utf-8").splitlines()[:1]
    records = []
    for n in range(count):
        record = json.loads(line)
        record["request"]["messages"][-1]["content"] = f"question {n}: the weather?"
        records.append(json.dumps(record))
    path.write_text("\n".join(records) + "\n", encoding="utf-8")
    return path


def test_a_killed_capture_keeps_whole_batches_and_a_rerun_completes_it_once(
    store: Store, tmp_path: Path
) -> None:
    source = _many_exchanges(tmp_path / "many.jsonl", CAPTURED)
    argv = [
        str(Path(sys.executable).parent / "triage"),
        "--database",
        store.url,
        "capture",
        "--batch",
        str(BATCH),
        str(source),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        stored = 0
        while process.poll() is None and stored == 0:  # until the first batch is committed
            stored = _evidence_count(store)
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
        assert process.stderr is not None
        process.stderr.close()
    kept = _evidence_count(store)
    assert 0 < kept < CAPTURED, f"kill landed outside the capture: {kept} of {CAPTURED} stored"
    assert kept % BATCH == 0  # whole batches only
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"stored {CAPTURED - kept} exchange(s)" in rerun.stdout
    assert f"{kept} exchange(s) not stored again" in rerun.stdout
    with store.session(readonly=True) as session:
        rows = session.exec(select(Evidence.key, Evidence.payload)).all()
    assert len(rows) == CAPTURED
    contents = {payload["exchange"]["request"]["messages"][-1]["content"] for _, payload in rows}
    assert contents == {f"question {n}: the weather?" for n in range(CAPTURED)}
    assert sorted(int(key[1:]) for key, _ in rows) == list(range(1, CAPTURED + 1))


def _incident_titles(url: str) -> list[str]:
    store = Store(url, migrate=False, readonly=False)
    try:
        with store.session(readonly=True) as session:
            return sorted(session.exec(select(Incident.title)).all())
    finally:
        store.close()


def test_a_read_only_open_lists_and_refuses_every_write(store: Store) -> None:
    with store.session() as session:
        open_incident(session, "Stored before the read-only open")
    listed = _cli(store.url, "--read-only", "incidents", "list")
    assert listed.exit_code == 0, listed.output
    assert "Stored before the read-only open" in listed.output
    refused = _cli(store.url, "--read-only", "incidents", "new", "Must not be stored")
    assert refused.exit_code == 1
    assert "read-only" in refused.output and "Traceback" not in refused.output
    captured = CliRunner().invoke(
        cli,
        ["--database", store.url, "capture", str(FIXTURES / "tool-args-invalid-json.json")],
        env={"TRIAGE_READ_ONLY": "1"},
    )
    assert captured.exit_code == 1 and "read-only" in captured.output
    assert _incident_titles(store.url) == ["Stored before the read-only open"]
    assert _evidence_count(store) == 0


@contextmanager
def _unwritable(directory: Path) -> Iterator[None]:
    """Make a directory and its files unwritable for this process: chmod, or as root (whom
    modes do not stop) the immutable attribute, which stops root too."""
    files = sorted(directory.iterdir())
    if os.geteuid() != 0:
        for path in files:
            path.chmod(0o444)
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
            for path in files:
                path.chmod(0o644)
        return
    chattr = shutil.which("chattr")
    targets = [str(p) for p in files] + [str(directory)]
    if chattr is None or subprocess.run([chattr, "+i", *targets]).returncode != 0:
        pytest.skip("running as root without chattr +i: cannot make a file read-only")
    try:
        assert not os.access(directory, os.W_OK)
        yield
    finally:
        subprocess.run([chattr, "-i", *targets], check=True)


def test_a_knowledge_base_this_user_cannot_write_is_still_listed(tmp_path: Path) -> None:
    folder = tmp_path / "mounted"
    url = f"sqlite:///{folder / 'kb.db'}"
    writable = Store(url)
    with writable.session() as session:
        open_incident(session, "Visible on a read-only mount")
    writable.close()
    before = sorted(p.name for p in folder.iterdir())
    with _unwritable(folder):
        listed = _cli(url, "incidents", "list")
        shown = _cli(url, "capture", "--orphans")
        refused = _cli(url, "incidents", "new", "Cannot be stored")
        assert sorted(p.name for p in folder.iterdir()) == before  # nothing created
    assert listed.exit_code == 0, listed.output
    assert "Visible on a read-only mount" in listed.output
    assert shown.exit_code == 0, shown.output
    assert refused.exit_code == 1 and "read-only" in refused.output, refused.output
    assert _incident_titles(url) == ["Visible on a read-only mount"]


def test_a_read_only_knowledge_base_behind_the_schema_is_a_clear_error(db_url: str) -> None:
    old = Store(db_url)
    old.downgrade("0002_search")
    old.close()
    with pytest.raises(ReadOnlyError, match=r"schema revision 0002_search, this triage needs"):
        Store(db_url, readonly=True)
    result = _cli(db_url, "--read-only", "incidents", "list")
    assert result.exit_code == 1
    assert "cannot be upgraded" in result.output and "Traceback" not in result.output
    check = Store(db_url, migrate=False, readonly=False)
    try:
        assert current_revision(check.engine) == "0002_search"  # nothing was migrated
    finally:
        check.close()


def test_the_ui_reads_a_read_only_knowledge_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    from kb.repo.files import import_paths
    from triage.ui import data

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "mounted"
    url = f"sqlite:///{folder / 'kb.db'}"
    writable = Store(url)
    import_paths(writable, [repo / "incidents"])
    writable.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    data.forget_stores()
    with _unwritable(folder):  # a read-only mount: no flag, the store finds out itself
        try:
            at = AppTest.from_file(str(repo / "triage" / "ui" / "app.py"), default_timeout=60).run()
            assert not at.exception, [e.value for e in at.exception]
            listed = [
                slug
                for df in at.dataframe
                if "Incident" in df.value.columns
                for slug in df.value["Incident"]
            ]
            assert "2026-06-10-gemma4-empty-response" in listed and len(listed) == 3
            at.switch_page("views/incident.py")
            at.query_params.update({"slug": "2026-06-10-gemma4-empty-response"})
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            page = [str(t.value) for t in at.title] + [str(m.value) for m in at.markdown]
            assert any("gemma4-empty-response" in text or "Gemma 4" in text for text in page)
            assert data.get_store().readonly
        finally:
            data.forget_stores()


IMPORTED = 60
IMPORT_BATCH = 5


def _incident_files(folder: Path, count: int) -> Path:
    """`count` small valid incident files (one evidence item each, no family links)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        slug = f"2026-07-01-imported-{n:05d}"
        (folder / f"{slug}.md").write_text(
            f"---\nslug: {slug}\ntitle: Imported incident {n}\nstatus: open\n"
            "opened: 2026-07-01\nevidence:\n  - id: E1\n    kind: log\n"
            f"    summary: log line {n}\n    recorded_at: 2026-07-01T10:00:00Z\n---\n"
            f"Narrative of incident {n}.\n",
            encoding="utf-8",
        )
    return folder


def _incident_count(store: Store) -> int:
    with store.session(readonly=True) as session:
        return int(session.exec(select(func.count()).select_from(Incident)).one())


def test_a_killed_import_keeps_whole_batches_and_a_rerun_imports_the_rest_once(
    store: Store, tmp_path: Path
) -> None:
    folder = _incident_files(tmp_path / "incidents", IMPORTED)
    argv = [
        str(Path(sys.executable).parent / "triage"),
        "--database",
        store.url,
        "import",
        "--batch",
        str(IMPORT_BATCH),
        str(folder),
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        stored = 0
        while process.poll() is None and stored == 0:  # until the first batch is committed
            stored = _incident_count(store)
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
        assert process.stderr is not None
        process.stderr.close()
    kept = _incident_count(store)
    assert 0 < kept < IMPORTED, f"kill landed outside the import: {kept} of {IMPORTED} stored"
    assert kept % IMPORT_BATCH == 0  # whole batches only
    with store.session(readonly=True) as session:  # and each kept incident whole
        evidence = int(session.exec(select(func.count()).select_from(Evidence)).one())
    assert evidence == kept
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"imported {IMPORTED - kept} incident(s)" in rerun.stdout
    assert f"{kept} incident(s) already stored from the same file(s)" in rerun.stdout
    with store.session(readonly=True) as session:
        slugs = session.exec(select(Incident.slug)).all()
        summaries = session.exec(select(Evidence.summary)).all()
    assert sorted(slugs) == [f"2026-07-01-imported-{n:05d}" for n in range(IMPORTED)]
    assert sorted(summaries) == sorted(f"log line {n}" for n in range(IMPORTED))


def test_a_reader_and_a_writer_succeed_while_an_import_runs(store: Store, tmp_path: Path) -> None:
    folder = _incident_files(tmp_path / "incidents", IMPORTED)
    argv = [str(Path(sys.executable).parent / "triage"), "--database", store.url]
    process = subprocess.Popen(
        [*argv, "import", "--batch", str(IMPORT_BATCH), str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while process.poll() is None and _incident_count(store) == 0:
            time.sleep(0.005)
        listed = _cli(store.url, "incidents", "list")
        # A writer gets the lock between two batches instead of waiting for the whole import.
        created = _cli(store.url, "incidents", "new", "Opened while an import runs")
    finally:
        if process.poll() is None:
            process.wait(timeout=600)
    assert process.returncode == 0
    assert listed.exit_code == 0, listed.output
    assert "2026-07-01-imported-00000" in listed.output
    assert created.exit_code == 0, created.output
    assert _incident_count(store) == IMPORTED + 1


def test_an_edited_file_already_stored_is_refused_and_stores_nothing(
    store: Store, tmp_path: Path
) -> None:
    folder = _incident_files(tmp_path / "incidents", 3)
    assert _cli(store.url, "import", str(folder)).exit_code == 0
    edited = folder / "2026-07-01-imported-00001.md"
    edited.write_text(
        edited.read_text(encoding="utf-8").replace("Imported incident 1", "Edited"), "utf-8"
    )
    (folder / "2026-07-01-imported-00009.md").write_text(
        (folder / "2026-07-01-imported-00000.md")
        .read_text(encoding="utf-8")
        .replace("imported-00000", "imported-00009"),
        encoding="utf-8",
    )
    again = _cli(store.url, "import", str(folder))
    assert again.exit_code == 1
    assert "2026-07-01-imported-00001.md: $.slug" in again.output
    assert "already stored" in again.output
    assert _incident_count(store) == 3  # the new file was not stored either
