"""Drill servers on an AMX host add --no-repack and say so; on other hosts nothing changes.
Both branches run on any machine through the TRIAGE_CPU_FLAGS override."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from triage.drills import build_drill
from triage.drills.host import (
    host_workaround_args,
    host_workaround_note,
    write_workaround_wrapper,
)
from triage.stackfile import load_stack

NOTE = "host workaround: --no-repack (AMX host, llama.cpp#20824)"
AMX_FLAGS = "fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"


@pytest.fixture
def stand_in_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "template.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    monkeypatch.setenv("TRIAGE_GEMMA4_TEMPLATE", str(path))


def test_workaround_args_follow_the_cpu_flags():
    assert host_workaround_args({"amx_int8", "avx512f"}) == ["--no-repack"]
    assert host_workaround_args({"amx_tile"}) == ["--no-repack"]
    assert host_workaround_args({"avx512f", "avx2"}) == []
    assert host_workaround_note({"amx_int8"}) == NOTE
    assert host_workaround_note(set()) is None


@pytest.mark.parametrize("name", ["gemma4-thinking-budget", "gemma4-toolcall"])
def test_drill_on_amx_host_adds_no_repack_and_says_so(
    tmp_path: Path, stand_in_template: None, monkeypatch: pytest.MonkeyPatch, name: str
):
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", AMX_FLAGS)
    drill = build_drill(name, tmp_path / name)
    assert "--no-repack" in drill.server_args and drill.host_note == NOTE
    stack_text = (drill.out_dir / "stack.toml").read_text()
    assert f"# {NOTE}" in stack_text  # visible to whoever opens the drill's stack
    assert "--no-repack" in tomllib.loads(stack_text)["server"]["args"]
    manifest = json.loads((drill.out_dir / "manifest.json").read_text())
    assert manifest["host_workaround"] == NOTE and "--no-repack" in manifest["server_args"]
    stack = load_stack(drill.out_dir / "stack.toml")
    assert "--no-repack" in stack.server.args
    # The spec-off arm strips only the speculative flags: every drill server avoids AMX.
    from triage.stackfile import strip_spec_flags

    assert "--no-repack" in strip_spec_flags(stack.server.args)


def test_drill_on_other_hosts_is_unchanged(
    tmp_path: Path, stand_in_template: None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "fpu sse2 avx2 avx512f")
    drill = build_drill("gemma4-thinking-budget", tmp_path / "d")
    assert "--no-repack" not in drill.server_args and drill.host_note is None
    stack_text = (drill.out_dir / "stack.toml").read_text()
    assert "--no-repack" not in stack_text and "workaround" not in stack_text
    assert json.loads((drill.out_dir / "manifest.json").read_text())["host_workaround"] is None


def _echo_binary(tmp_path: Path) -> Path:
    real = tmp_path / "real-server"
    real.write_text(f"#!{sys.executable}\nimport sys\nprint(' '.join(sys.argv[1:]))\n")
    real.chmod(0o755)
    return real


def test_suite_wrapper_appends_no_repack_on_amx_host_only(tmp_path: Path):
    real = _echo_binary(tmp_path)
    assert write_workaround_wrapper(real, tmp_path / "plain", flags={"avx2"}) is None
    assert not (tmp_path / "plain").exists()
    wrapper = write_workaround_wrapper(real, tmp_path / "w" / "llama-server", flags={"amx_int8"})
    assert wrapper is not None
    done = subprocess.run(
        [str(wrapper), "-m", "a b.gguf", "--port", "1"], capture_output=True, text=True, timeout=30
    )
    assert done.stdout.strip() == "-m a b.gguf --port 1 --no-repack"
    assert NOTE in done.stderr  # the server log says why the flag is there


def test_stack_note_is_read_back_from_drill_stacks_only(
    tmp_path: Path, stand_in_template: None, monkeypatch: pytest.MonkeyPatch
):
    from triage.drills.host import stack_host_note

    monkeypatch.setenv("TRIAGE_CPU_FLAGS", AMX_FLAGS)
    amx = build_drill("gemma4-thinking-budget", tmp_path / "amx")
    assert stack_host_note(amx.out_dir / "stack.toml") == NOTE
    monkeypatch.setenv("TRIAGE_CPU_FLAGS", "avx2")
    plain = build_drill("gemma4-thinking-budget", tmp_path / "plain")
    assert stack_host_note(plain.out_dir / "stack.toml") is None
    # A user's stack with --no-repack of their own is not labelled a host workaround.
    user = tmp_path / "user.toml"
    user.write_text(
        '[server]\nmodel = "m.gguf"\nargs = ["--no-repack"]\n'
        "# host workaround: --no-repack (AMX host, llama.cpp#20824)\n"
    )
    assert stack_host_note(user) is None
    assert stack_host_note(tmp_path / "missing.toml") is None
