"""Issue 18 (2, 3, 5): hostile incident files, export through planted links, non-ASCII slugs.

The YAML bombs run in a child process under an address-space limit and a wall-clock
timeout, so a regression fails the test instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import date
from pathlib import Path

import pytest

from kb.domain.slugs import SLUG_RE, ascii_slug, incident_slug, unique_incident_slug
from kb.models import Incident
from kb.repo.fileparse import parse_file
from kb.repo.files import (
    ExportError,
    RecordError,
    export_all,
    export_incident,
    export_incidents,
    import_paths,
    load_yaml,
)
from kb.repo.store import Store

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 1536 * 1024 * 1024  # bytes of address space for the child
CHILD_TIMEOUT_S = 120

HEAD = "---\nslug: 2026-07-01-hostile\ntitle: t\nstatus: open\nopened: 2026-07-01\n"


def _bomb(levels: int = 9) -> str:
    lines = ["stack:", '  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"  l{level}: &l{level} [{refs}]")
    return HEAD + "\n".join(lines) + "\n---\n"


HOSTILE = {
    "alias-bomb": (_bomb(), "alias bomb"),
    "recursive-alias": (HEAD + "stack: &s {self: *s}\n---\n", "recursive alias *s"),
    "nested-brackets": (HEAD + "stack: " + "[" * 50_000 + "]" * 50_000 + "\n---\n", "nesting"),
    "many-aliases": (
        HEAD + "stack:\n  a: &a x\n  b: [" + ", ".join(["*a"] * 2_000) + "]\n---\n",
        "more than 1000 aliases",
    ),
}

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from kb.repo.files import RecordError, parse_file
    try:
        parse_file(sys.argv[1])
    except RecordError as exc:
        print(json.dumps({{"file": exc.file, "path": exc.json_path, "message": exc.message}}))
        sys.exit(0)
    except BaseException as exc:
        print(json.dumps({{"unhandled": type(exc).__name__}}))
        sys.exit(3)
    print(json.dumps({{"accepted": True}}))
    sys.exit(4)
    """
)


def _parse_in_child(path: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(limit=MEMORY_LIMIT), str(path)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"parsing {path.name} ran longer than {CHILD_TIMEOUT_S} s")
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml_is_refused_with_a_clear_error_naming_the_file(
    case: str, tmp_path: Path
) -> None:
    text, fragment = HOSTILE[case]
    path = tmp_path / "2026-07-01-hostile.md"
    path.write_text(text, encoding="utf-8")
    result = _parse_in_child(path)
    assert result["file"] == str(path)
    assert result["path"] == "$"
    assert "invalid YAML front matter" in result["message"]
    assert fragment in result["message"]


def test_yaml_limits_keep_ordinary_aliases_and_depth() -> None:
    shallow = load_yaml("a: &x [1, 2]\nb: *x\nc: " + "[" * 50 + "]" * 50 + "\n")
    assert shallow["b"] == [1, 2]


def test_parse_file_refuses_devices_fifos_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="not a regular file"):
        parse_file("/dev/zero")
    fifo = tmp_path / "2026-07-01-fifo.md"
    os.mkfifo(fifo)
    with pytest.raises(RecordError, match="not a regular file") as caught:
        parse_file(fifo)  # would block forever if opened for a plain read
    assert caught.value.file == str(fifo)
    big = tmp_path / "2026-07-01-big.md"
    with big.open("wb") as handle:
        handle.truncate(17 * 1024 * 1024)
    with pytest.raises(RecordError, match="larger than the limit"):
        parse_file(big)


# --------------------------------------------------------------------------- export


def _minimal_file(directory: Path, slug: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{slug}.md"
    path.write_text(
        f"---\nslug: {slug}\ntitle: Minimal\nstatus: open\nopened: {slug[:10]}\n---\nbody\n",
        encoding="utf-8",
    )
    return path


def test_export_never_follows_a_planted_temp_symlink(store: Store, tmp_path: Path) -> None:
    slug = "2026-07-01-minimal"
    import_paths(store, [_minimal_file(tmp_path / "in", slug)])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "outside.txt"
    victim.write_text("precious\n", encoding="utf-8")
    (out / f".{slug}.md.tmp").symlink_to(victim)
    export_incident(store, slug, out)
    export_all(store, out)
    assert victim.read_text(encoding="utf-8") == "precious\n"
    assert (out / f"{slug}.md").read_text(encoding="utf-8").startswith(f"---\nslug: {slug}\n")
    assert not (out / f"{slug}.md").is_symlink()
    # No temporary file is left behind; the planted link is untouched.
    assert sorted(p.name for p in out.iterdir()) == [f".{slug}.md.tmp", f"{slug}.md"]


def test_export_replaces_a_symlinked_target_instead_of_writing_through_it(
    store: Store, tmp_path: Path
) -> None:
    slug = "2026-07-01-minimal"
    import_paths(store, [_minimal_file(tmp_path / "in", slug)])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "outside.txt"
    victim.write_text("precious\n", encoding="utf-8")
    (out / f"{slug}.md").symlink_to(victim)
    export_all(store, out)
    assert victim.read_text(encoding="utf-8") == "precious\n"
    assert not (out / f"{slug}.md").is_symlink()


def test_one_bad_record_does_not_block_the_others(store: Store, tmp_path: Path) -> None:
    good = ["2026-07-01-alpha", "2026-07-03-gamma"]
    import_paths(store, [_minimal_file(tmp_path / "in", slug) for slug in good])
    bad_slug = "2026-07-02-modèle-über²-qat"  # what the engine used to write
    with store.session() as session:
        session.add(Incident(slug=bad_slug, title="bad", opened_on=date(2026, 7, 2)))
    out = tmp_path / "out"
    with pytest.raises(ExportError) as caught:
        export_all(store, out)
    assert [Path(p).name for p in caught.value.written] == [f"{s}.md" for s in good]
    assert [f.file for f in caught.value.failures] == [str(out / f"{bad_slug}.md")]
    assert caught.value.json_path == "$.slug"
    assert bad_slug in str(caught.value)
    assert sorted(p.name for p in out.iterdir()) == [f"{s}.md" for s in good]
    written, errors = export_incidents(store, tmp_path / "some", [good[1], bad_slug])
    assert [p.name for p in written] == [f"{good[1]}.md"] and len(errors) == 1


# --------------------------------------------------------------------------- slugs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Modèle-ÜBER²-qat", "modele-uber2-qat"),
        ("gemma-4-31B-it-Q4_K_M", "gemma-4-31b-it-q4-k-m"),
        ("Straße ﬁne Ærø", "strasse-fine-aero"),
        ("模型", "incident"),
        ("--..--", "incident"),
    ],
)
def test_ascii_slug_transliterates(text: str, expected: str) -> None:
    assert ascii_slug(text) == expected


def test_incident_slugs_always_match_the_file_pattern() -> None:
    slug = incident_slug(date(2026, 12, 1), "Modèle-ÜBER²-qat", "empty-content")
    assert slug == "2026-12-01-modele-uber2-qat-empty-content"
    assert SLUG_RE.match(incident_slug(date(2026, 12, 1), "x" * 500))
    taken = {slug, f"{slug}-2"}
    assert (
        unique_incident_slug(
            date(2026, 12, 1), "Modèle-ÜBER²-qat", "empty-content", exists=taken.__contains__
        )
        == f"{slug}-3"
    )


def test_export_cli_writes_the_good_records_names_the_bad_one_and_fails(
    store: Store, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from triage.cli import cli

    good = "2026-07-01-alpha"
    import_paths(store, [_minimal_file(tmp_path / "in", good)])
    bad_slug = "2026-07-02-modèle-über²-qat"
    with store.session() as session:
        session.add(Incident(slug=bad_slug, title="bad", opened_on=date(2026, 7, 2)))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        ["export", "--out", str(out)],
        env={"TRIAGE_DATABASE_URL": store.url, "TRIAGE_HOME": str(tmp_path / "home")},
    )
    assert result.exit_code == 1, result.output
    assert "wrote 1 file(s)" in result.stdout
    assert f"Error: not exported: {out / bad_slug}.md: $.slug:" in result.stderr
    assert (out / f"{good}.md").exists()
