"""Issue 17: a drill incident diagnosed on the real llama-server exports as a small incident
file plus its evidence sidecar, and the round trip through a second database is
byte-identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.repo.files import export_incident, import_paths, load_record
from kb.repo.store import Store

pytestmark = pytest.mark.integration

MARKDOWN_LIMIT = 50_000


def test_diagnosed_drill_incident_exports_small_and_round_trips(
    server_binary: Path, tmp_path: Path
) -> None:
    from triage.demo import run_demo

    url = f"sqlite:///{tmp_path / 'kb.db'}"
    diagnosis = run_demo(url, tmp_path / "work", max_requests=16)
    slug = diagnosis.incident
    store = Store(url)
    try:
        first = export_incident(store, slug, tmp_path / "a")
        with store.session(readonly=True) as session:
            stored = load_record(session, slug)
    finally:
        store.close()
    sidecars = sorted(p.name for p in first.parent.glob(f"{slug}.evidence.jsonl*"))
    assert len(sidecars) == 1
    sidecar = first.with_name(sidecars[0])
    size = len(first.read_bytes())
    assert size < MARKDOWN_LIMIT, f"{first.name} is {size} bytes"
    probes = [e for e in stored["evidence"] if e["kind"] == "probe"]
    assert probes, "the diagnosis stored its replays"
    assert "kind: probe" not in first.read_text(encoding="utf-8")

    other = Store(f"sqlite:///{tmp_path / 'second.db'}")
    try:
        import_paths(other, [first])
        second = export_incident(other, slug, tmp_path / "b")
        with other.session(readonly=True) as session:
            reloaded = load_record(session, slug)
    finally:
        other.close()
    assert second.read_bytes() == first.read_bytes()
    assert second.with_name(sidecar.name).read_bytes() == sidecar.read_bytes()
    assert reloaded["evidence"] == stored["evidence"]
    print(
        f"\n{first.name}: {size} bytes; {sidecar.name}: {sidecar.stat().st_size} bytes; "
        f"{len(probes)} replays in the sidecar"
    )
