"""The shipped atlas data: every entry file in kb/atlas/entries/ is a usable pointer to a public
report (front matter per /work/coord/ATLAS_FORMAT.md), and every held-out evaluation case in
tests/fixtures/atlas_eval/ names entries that exist.

A broken entry would be skipped or refused by `triage atlas list`, and a case expecting a
renamed entry would silently count as a miss in the README's precision/recall table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from triage.catalogue import catalogue

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = ROOT / "kb" / "atlas" / "entries"
CASES = ROOT / "tests" / "fixtures" / "atlas_eval"
PROJECTS = {
    "llama.cpp", "ollama", "lm-studio", "llama-swap", "koboldcpp", "open-webui",
    "litellm", "opencode", "cline", "codex", "vllm", "other",
}  # fmt: skip
BACKENDS = {"cpu", "cuda", "metal", "vulkan", "rocm", "sycl"}
# The catalogue cause ids of ATLAS_FORMAT.md: today's vocabulary plus the numbers pre-assigned
# to causes other developers are adding this session (COMMON.md), so entries can name them now.
ASSIGNED_CAUSES = {
    "model-loop", "gateway-timeout", "server-flags", "schema-not-enforced", "prompt-cache",
    "stream-format", "embedding-batch",
}  # fmt: skip
SIGNATURE_LISTS = ("finding_kinds", "http_status", "error_strings", "log_strings")
FENCE = re.compile(r"\A---\n(.*?)\n---\n(.*)\Z", re.DOTALL)


def _entry_files() -> list[Path]:
    return sorted(p for p in ENTRIES.glob("*.md") if p.name.lower() != "readme.md")


def _front_matter(path: Path) -> tuple[dict[str, Any], str]:
    match = FENCE.match(path.read_text(encoding="utf-8"))
    assert match, f"{path.name}: no front matter between --- lines"
    data = yaml.safe_load(match.group(1))
    assert isinstance(data, dict), f"{path.name}: front matter is not a mapping"
    return data, match.group(2)


def test_the_atlas_ships_at_least_sixty_entries() -> None:
    assert len(_entry_files()) >= 60


@pytest.mark.parametrize("path", _entry_files(), ids=lambda p: p.stem)
def test_entry_front_matter_is_complete_and_in_vocabulary(path: Path) -> None:
    data, body = _front_matter(path)
    assert data["id"] == path.stem
    assert data["project"] in PROJECTS
    assert str(data["source"]).startswith("https://")
    assert all(str(url).startswith("https://") for url in data.get("related") or [])
    assert data["cause"] in set(catalogue().causes.ids()) | ASSIGNED_CAUSES | {"other"}
    for key in ("title", "identified_by", "cause_text"):
        assert isinstance(data.get(key), str) and data[key].strip(), f"{key} is empty"
    signatures = data["signatures"]
    assert any(signatures.get(name) for name in SIGNATURE_LISTS), "no signature"
    kinds = set(catalogue().checks.ids())
    assert set(signatures.get("finding_kinds") or []) <= kinds
    assert all(isinstance(s, int) and 100 <= s <= 599 for s in signatures.get("http_status") or [])
    for name in ("error_strings", "log_strings"):
        # a substring the matcher compares: short ones would match unrelated logs
        assert all(isinstance(s, str) and len(s.strip()) >= 6 for s in signatures.get(name) or [])
    assert set(data.get("backends") or []) <= BACKENDS
    assert all(isinstance(n, int) and n > 0 for n in (data.get("builds") or {}).values())
    reported = data.get("reported")
    assert reported is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(reported))
    lines = [line for line in body.splitlines() if line.strip()]
    assert 2 <= len(lines) <= 15, "the body is a short account of the public thread"


def test_entry_ids_and_sources_are_unique() -> None:
    seen: dict[str, str] = {}
    for path in _entry_files():
        data, _ = _front_matter(path)
        source = str(data["source"])
        assert source not in seen, f"{path.stem} and {seen.get(source)} cite the same report"
        seen[source] = path.stem


def _case_dirs() -> list[Path]:
    return sorted(p for p in CASES.iterdir() if (p / "case.yaml").is_file())


@pytest.mark.parametrize("folder", _case_dirs(), ids=lambda p: p.name)
def test_eval_case_names_existing_entries_and_is_held_out(folder: Path) -> None:
    case = yaml.safe_load((folder / "case.yaml").read_text(encoding="utf-8"))
    ids = {p.stem for p in _entry_files()}
    sources = {str(_front_matter(p)[0]["source"]) for p in _entry_files()}
    assert case["kind"] in {"capture", "log"}
    assert (folder / case["input"]).is_file()
    assert case["input"] == ("capture.json" if case["kind"] == "capture" else "server.log")
    assert set(case["expect"]) <= ids, "expects an entry the atlas does not have"
    # held out: the case's report is not itself an atlas entry
    assert case["source"] not in sources
    build = case.get("build")
    assert build is None or (isinstance(build, int) and build > 0)


def test_the_held_out_split_has_relatives_and_strangers() -> None:
    expects = [
        yaml.safe_load((d / "case.yaml").read_text(encoding="utf-8"))["expect"]
        for d in _case_dirs()
    ]
    assert len(expects) >= 15
    assert sum(1 for e in expects if e) >= 10
    assert sum(1 for e in expects if not e) >= 5
