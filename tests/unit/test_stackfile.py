"""stack.toml parsing and the argument transforms of server-level arms."""

from __future__ import annotations

from pathlib import Path

import pytest

from triage.probes import known_good_dimensions, revert_dimensions, server_arms
from triage.stackfile import StackError, has_spec_flags, load_stack, strip_spec_flags


def _write(tmp_path: Path, text: str) -> Path:
    for name in ("q.gguf", "m.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    path = tmp_path / "stack.toml"
    path.write_text(text)
    return path


def test_relative_paths_resolve_against_the_stack_file(tmp_path: Path) -> None:
    stack = load_stack(
        _write(
            tmp_path,
            """
[server]
model = "q.gguf"
args = ["-c", "8192", "--spec-type", "draft-simple", "-md", "d.gguf"]
[alternates]
model = "m.gguf"
""",
        )
    )
    assert stack.server.model == tmp_path / "q.gguf"
    assert stack.alternate_model == tmp_path / "m.gguf"
    assert stack.speculative
    names = [arm.name for arm in server_arms(stack)]
    assert names == ["spec-off", "alt-weights", "server-reasoning-off"]
    spec_off = server_arms(stack)[0].config
    assert list(spec_off.args) == ["-c", "8192"]


@pytest.mark.parametrize(
    "text, path",
    [
        ("[server]\nargs = []\n", "$.server"),
        ('[server]\nmodel = "q.gguf"\nargs = "x"\n', "$.server.args"),
        ('[server]\nmodel = "nope.gguf"\n', "$.server.model"),
        ('[server]\nmodel = "q.gguf"\n[alternate]\nmodel="m.gguf"\n', "$"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_stack_files_name_the_field(tmp_path: Path, text: str, path: str) -> None:
    with pytest.raises(StackError) as info:
        load_stack(_write(tmp_path, text))
    assert str(tmp_path / "stack.toml") in str(info.value)
    assert path in str(info.value)


def test_strip_spec_flags_handles_every_spelling() -> None:
    args = [
        "-c",
        "4096",
        "--spec-type=draft-mtp",
        "--model-draft",
        "d.gguf",
        "--spec-draft-n-max",
        "3",
        "--jinja",
        "--spec-default",
    ]
    assert strip_spec_flags(args) == ["-c", "4096", "--jinja"]
    assert has_spec_flags(args)
    assert not has_spec_flags(["-c", "4096", "--spec-type", "none"])


def test_known_good_dimensions_and_reversion(tmp_path: Path) -> None:
    stack = load_stack(
        _write(
            tmp_path,
            """
[server]
model = "q.gguf"
args = ["-c", "8192", "--spec-type", "draft-simple", "-md", "d.gguf"]
[known_good]
model = "m.gguf"
args = ["-c", "8192"]
""",
        )
    )
    dims = known_good_dimensions(stack)
    assert sorted(dims) == ["spec-flags", "weights"]
    only_weights = revert_dimensions(stack, {"weights"})
    assert only_weights.model == tmp_path / "m.gguf"
    assert "--spec-type" in only_weights.args
    only_spec = revert_dimensions(stack, {"spec-flags"})
    assert only_spec.model == tmp_path / "q.gguf" and "--spec-type" not in only_spec.args


def test_spec_values_equal_to_other_args_stay_on_their_side(tmp_path: Path) -> None:
    # "-np 3 ... --spec-draft-n-max 3": the value 3 belongs to both sides, once each.
    from triage.stackfile import split_spec_flags

    other, spec = split_spec_flags(["-np", "3", "--spec-draft-n-max", "3", "-md", "d.gguf"])
    assert other == ["-np", "3"]
    assert spec == ["--spec-draft-n-max", "3", "-md", "d.gguf"]
    stack = load_stack(
        _write(
            tmp_path,
            """
[server]
model = "q.gguf"
args = ["-np", "3", "--spec-type", "draft-simple", "--spec-draft-n-max", "3"]
[known_good]
args = ["-np", "3"]
""",
        )
    )
    reverted = revert_dimensions(stack, {"other-args"})
    assert list(reverted.args) == [
        "-np",
        "3",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "3",
    ]
