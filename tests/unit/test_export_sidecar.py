"""Issue 17: export keeps the record in the front matter and replay evidence in a sidecar
(`<slug>.evidence.jsonl`, gzip when large); the round trip stays byte-identical."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kb.models import Cause
from kb.repo.fileparse import parse_file
from kb.repo.files import RecordError, export_all, import_paths
from kb.repo.sidecar import GZIP_FROM_BYTES
from kb.repo.store import EvidenceItem, Store, add_evidence_many, get_incident, record_status_change

SLUG = "2026-07-01-replayed"


def _incident(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{SLUG}.md"
    path.write_text(
        f"---\nslug: {SLUG}\ntitle: Replayed\nstatus: open\nopened: 2026-07-01\n"
        "evidence:\n- id: E1\n  kind: exchange\n  summary: the failing exchange\n"
        "  recorded_at: 2026-07-01\n---\nNarrative.\n",
        encoding="utf-8",
    )
    return path


def _diagnose(store: Store, replies: int, reasoning_chars: int) -> None:
    """What a diagnosis stores: one probe row per replay, an arm measurement, a cause that
    cites both."""
    at = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
    with store.session() as session:
        incident = get_incident(session, SLUG)
        assert incident is not None
        probes = add_evidence_many(
            session,
            incident.id,
            [
                EvidenceItem(
                    kind="probe",
                    summary=f"baseline #{n} seed {n}: FAIL length",
                    payload={"seed": n, "reasoning": "x" * reasoning_chars, "finish": "length"},
                    source="triage diagnose",
                    recorded_at=at,
                )
                for n in range(replies)
            ],
        )
        (arm,) = add_evidence_many(
            session,
            incident.id,
            [
                EvidenceItem(
                    kind="measurement",
                    summary=f"arm baseline: {replies}/{replies} failed",
                    payload={"type": "arm", "n": replies},
                    recorded_at=at,
                ),
            ],
        )
        cause = Cause(
            incident_id=incident.id,
            key="token-limit",
            catalogue_id="token-limit",
            title="limit",
            status="suspected",
        )
        record_status_change(
            session, cause, "suspected", actor="engine", rationale="planned", at=at
        )
        record_status_change(
            session,
            cause,
            "confirmed",
            actor="engine",
            rationale="decided",
            evidence_keys=[probes[0].key, arm.key],
            at=at,
        )


def _round_trip(store: Store, tmp_path: Path) -> tuple[Path, Path]:
    (first,) = export_all(store, tmp_path / "a")
    other = Store(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        import_paths(other, [first])
        (second,) = export_all(other, tmp_path / "b")
    finally:
        other.close()
    return first, second


def test_replays_go_to_a_sidecar_and_round_trip_byte_for_byte(store: Store, tmp_path: Path) -> None:
    import_paths(store, [_incident(tmp_path / "in")])
    _diagnose(store, replies=40, reasoning_chars=200)
    first, second = _round_trip(store, tmp_path)
    sidecar = first.with_name(f"{SLUG}.evidence.jsonl")
    lines = sidecar.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [f"E{n}" for n in range(2, 42)]
    text = first.read_text(encoding="utf-8")
    assert "kind: probe" not in text and "id: E42" in text and "- E2\n" in text
    assert second.read_bytes() == first.read_bytes()
    assert second.with_name(sidecar.name).read_bytes() == sidecar.read_bytes()
    record = parse_file(first)
    assert [e["id"] for e in record["evidence"]] == [f"E{n}" for n in range(1, 43)]


def test_a_large_sidecar_is_gzipped_deterministically(store: Store, tmp_path: Path) -> None:
    import_paths(store, [_incident(tmp_path / "in")])
    _diagnose(store, replies=300, reasoning_chars=2_000)
    first, second = _round_trip(store, tmp_path)
    packed = first.with_name(f"{SLUG}.evidence.jsonl.gz")
    assert not first.with_name(f"{SLUG}.evidence.jsonl").exists()
    assert len(gzip.decompress(packed.read_bytes())) >= GZIP_FROM_BYTES
    assert second.with_name(packed.name).read_bytes() == packed.read_bytes()
    assert second.read_bytes() == first.read_bytes()
    assert len(first.read_bytes()) < 10_000  # the record, not 300 replays


def test_stale_sidecars_are_replaced(store: Store, tmp_path: Path) -> None:
    import_paths(store, [_incident(tmp_path / "in")])
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f"{SLUG}.evidence.jsonl.gz"
    stale.write_bytes(gzip.compress(b'{"id":"E9","kind":"probe"}\n'))
    export_all(store, out)  # no replay evidence stored: no sidecar may stay behind
    assert not stale.exists()
    assert parse_file(out / f"{SLUG}.md")["evidence"][0]["id"] == "E1"


@pytest.mark.parametrize(
    ("line", "where", "fragment"),
    [
        ("{not json", "line 2", "not JSON"),
        (
            '{"id": "E2", "kind": "probe", "summary": "s", "recorded_at": "2026-07-01", '
            '"payload": {"x": NaN}}',
            "line 2",
            "NaN",
        ),
        (
            '{"id": "E2", "kind": "rumour", "summary": "s", "recorded_at": "2026-07-01"}',
            "line 2: $.kind",
            "rumour",
        ),
        (
            '{"id": "E1", "kind": "probe", "summary": "s", "recorded_at": "2026-07-01"}',
            "line 2: $.id",
            "duplicate evidence id",
        ),
        ("[1, 2]", "line 2", "JSON object"),
        (
            '{"id": "E2", "kind": "probe", "payload": ' + "[" * 200 + "]" * 200 + "}",
            "line 2",
            "nested",
        ),
    ],
)
def test_a_bad_sidecar_line_is_named(
    store: Store, tmp_path: Path, line: str, where: str, fragment: str
) -> None:
    path = _incident(tmp_path / "in")
    good = '{"id": "E5", "kind": "probe", "summary": "ok", "recorded_at": "2026-07-01"}'
    sidecar = path.with_name(f"{SLUG}.evidence.jsonl")
    sidecar.write_text(f"{good}\n{line}\n", encoding="utf-8")
    with pytest.raises(RecordError) as caught:
        import_paths(store, [path])
    assert caught.value.file == str(sidecar)
    assert caught.value.json_path.startswith(where)
    assert fragment in caught.value.message


def test_both_sidecar_forms_at_once_are_refused(store: Store, tmp_path: Path) -> None:
    path = _incident(tmp_path / "in")
    path.with_name(f"{SLUG}.evidence.jsonl").write_text("", encoding="utf-8")
    path.with_name(f"{SLUG}.evidence.jsonl.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(RecordError, match="keep one"):
        import_paths(store, [path])


def test_a_gzip_bomb_sidecar_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kb.repo.sidecar

    monkeypatch.setattr(kb.repo.sidecar, "MAX_SIDECAR_BYTES", 1 << 20)
    path = _incident(tmp_path / "in")
    path.with_name(f"{SLUG}.evidence.jsonl.gz").write_bytes(gzip.compress(b" " * (4 << 20)))
    with pytest.raises(RecordError, match="decompresses to more than"):
        parse_file(path)


def test_export_cli_names_the_sidecar(store: Store, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from triage.cli import cli

    import_paths(store, [_incident(tmp_path / "in")])
    _diagnose(store, replies=3, reasoning_chars=10)
    result = CliRunner().invoke(
        cli,
        ["export", "--out", str(tmp_path / "out")],
        env={"TRIAGE_DATABASE_URL": store.url, "TRIAGE_HOME": str(tmp_path / "home")},
    )
    assert result.exit_code == 0, result.output
    assert f"    + {SLUG}.evidence.jsonl (replay evidence)" in result.stdout.splitlines()
