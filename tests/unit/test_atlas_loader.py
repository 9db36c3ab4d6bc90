"""Atlas entry files: the schema, the bounded loader (hostile files get one clear error
naming the file and the field), team folders and `import_atlas`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kb.atlas import AtlasError, atlas_dirs, import_atlas, load_atlas, load_entry
from kb.atlas.loader import MAX_ENTRY_BYTES, SHIPPED_DIR, team_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "atlas" / "entries"

GOOD = """---
id: llama.cpp-1
title: "A crash"
project: llama.cpp
source: https://github.com/ggml-org/llama.cpp/issues/1
cause: cpu-backend
signatures:
  log_strings: ["ggml_some_kernel_name"]
builds:
  affected_from: 100
  fixed_in: 200
---
Body text.
"""


def write(folder: Path, name: str, text: str | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_fixture_entries_load_as_typed_records() -> None:
    entries = {e.id: e for e in load_atlas([FIXTURES])}
    amx = entries["llama.cpp-20824"]
    assert amx.cause == "cpu-backend"
    assert amx.signatures.log_strings == ("ggml_backend_amx_mul_mat",)
    assert (amx.builds.affected_from, amx.builds.affected_to, amx.builds.fixed_in) == (
        9000,
        11434,
        11500,
    )
    assert amx.cpu_flags == ("amx_int8",)
    assert amx.to_dict()["source"] == "https://github.com/ggml-org/llama.cpp/issues/20824"
    assert entries["llama.cpp-10920"].reported == "2024-12-20"  # a date stays a string


def test_a_good_entry_parses(tmp_path: Path) -> None:
    entry = load_entry(write(tmp_path, "llama.cpp-1.md", GOOD))
    assert entry.body == "Body text."
    assert entry.builds.describe() == "affected b100..?, fixed in b200"


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (GOOD.replace('title: "A crash"', 'title: "A crash'), "$", "invalid YAML"),
        (GOOD.replace("cause: cpu-backend\n", ""), "$", "'cause' is a required property"),
        (GOOD.replace("cause: cpu-backend", "cause: gremlins"), "$.cause", "gremlins"),
        (GOOD.replace("affected_from: 100", "affected_from: soon"), "$.builds.affected_from", ""),
        (
            GOOD.replace("source: https://", "source: http://"),
            "$.source",
            "does not match",
        ),
        (
            GOOD.replace('log_strings: ["ggml_some_kernel_name"]', "log_strings: []"),
            "$.signatures.log_strings",
            "",
        ),
        (
            GOOD.replace('["ggml_some_kernel_name"]', '["ab"]'),
            "$.signatures.log_strings[0]",
            "short",
        ),
        (GOOD.replace("id: llama.cpp-1", "id: llama.cpp-2"), "$.id", "file name"),
        (GOOD.replace("project: llama.cpp", "project: llama.cpp\nsurprise: 1"), "$", "surprise"),
        (GOOD.replace("---\nid", "id"), "$", "must start with a '---' line"),
        (GOOD.rsplit("---", 1)[0].replace("---\n", "", 1).join(["---\n", ""]), "$", "closing"),
        ("---\n- a list\n---\n", "$", "mapping"),
        (GOOD.replace("title:", "title: !!python/object:os.system\n  x:"), "$", "invalid YAML"),
    ],
)
def test_a_bad_entry_is_one_error_naming_file_and_field(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    path = write(tmp_path, "llama.cpp-1.md", text)
    with pytest.raises(AtlasError) as caught:
        load_entry(path)
    error = caught.value
    assert error.file == str(path)
    assert error.json_path == field
    assert words in str(error)
    assert str(error).startswith(f"{path}: {field}: ")
    assert "\n" not in str(error)


def test_a_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, "llama.cpp-1.md", GOOD + "x" * MAX_ENTRY_BYTES)
    with pytest.raises(AtlasError, match="larger than the limit"):
        load_entry(path)


def test_an_alias_bomb_and_bad_bytes_are_refused(tmp_path: Path) -> None:
    bomb = "---\n" + "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for name in "bcdefghi":
        prev = chr(ord(name) - 1)
        bomb += f"{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    bomb += "---\n"
    with pytest.raises(AtlasError, match=r"\$: invalid YAML"):
        load_entry(write(tmp_path, "bomb.md", bomb))
    with pytest.raises(AtlasError, match="not UTF-8"):
        load_entry(write(tmp_path, "llama.cpp-1.md", b"---\nid: \xff\xfe\n---\n"))


def test_a_long_string_in_an_error_is_cut(tmp_path: Path) -> None:
    path = write(
        tmp_path, "llama.cpp-1.md", GOOD.replace("cause: cpu-backend", "cause: " + "z" * 5000)
    )
    with pytest.raises(AtlasError) as caught:
        load_entry(path)
    assert len(str(caught.value)) < 400


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "llama.cpp-1.md"
    os.mkfifo(fifo)
    with pytest.raises(AtlasError, match="not a regular file"):
        load_entry(fifo)


def test_later_folders_replace_entries_and_readme_is_skipped(tmp_path: Path) -> None:
    team = tmp_path / "team"
    write(team, "llama.cpp-20824.md", GOOD.replace("llama.cpp-1", "llama.cpp-20824"))
    write(team, "README.md", "not an entry")
    entries = {e.id: e for e in load_atlas([FIXTURES, team])}
    assert entries["llama.cpp-20824"].title == "A crash"
    assert len(entries) == len(list(FIXTURES.glob("*.md")))


def test_one_bad_file_in_a_folder_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "llama.cpp-1.md", GOOD)
    bad = write(
        tmp_path,
        "llama.cpp-2.md",
        GOOD.replace("llama.cpp-1", "llama.cpp-2").replace("project: llama.cpp", "project: 7"),
    )
    with pytest.raises(AtlasError) as caught:
        load_atlas([tmp_path])
    assert caught.value.file == str(bad) and caught.value.json_path == "$.project"
    with pytest.raises(AtlasError, match="not a folder"):
        load_atlas([tmp_path / "missing"])


def test_atlas_dirs_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_ATLAS_PATH", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert atlas_dirs([tmp_path / "c"]) == [
        SHIPPED_DIR,
        tmp_path / "a",
        tmp_path / "b",
        tmp_path / "c",
    ]
    team_dir().mkdir(parents=True)
    assert atlas_dirs()[:2] == [SHIPPED_DIR, team_dir()]


def test_import_checks_everything_first_then_copies(tmp_path: Path) -> None:
    source, target = tmp_path / "ours", tmp_path / "team"
    write(source, "llama.cpp-1.md", GOOD)
    bad = write(source, "llama.cpp-2.md", "---\nid: llama.cpp-2\n---\n")
    with pytest.raises(AtlasError) as caught:
        import_atlas(source, target)
    assert caught.value.file == str(bad)
    assert not target.exists()  # nothing written
    bad.unlink()
    result = import_atlas(source, target)
    assert result.added == ("llama.cpp-1",)
    assert (target / "llama.cpp-1.md").read_text(encoding="utf-8") == GOOD
    assert import_atlas(source, target).unchanged == ("llama.cpp-1",)
    write(source, "llama.cpp-1.md", GOOD.replace("A crash", "A crash, again"))
    assert import_atlas(source, target).updated == ("llama.cpp-1",)
    assert [p.name for p in target.iterdir()] == ["llama.cpp-1.md"]  # no temporary left
    (tmp_path / "empty").mkdir()
    with pytest.raises(AtlasError, match="no entry files"):
        import_atlas(tmp_path / "empty", target)


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = write(tmp_path, "llama.cpp-1.md", GOOD)
    assert load_atlas([tmp_path])[0].title == "A crash"
    path.write_text(GOOD.replace("A crash", "A crash at start-up"), encoding="utf-8")
    assert load_atlas([tmp_path])[0].title == "A crash at start-up"
    path.write_text(GOOD.replace("cause: cpu-backend", "cause: nope"), encoding="utf-8")
    with pytest.raises(AtlasError, match=r"\$.cause"):
        load_atlas([tmp_path])
