"""Benchmark (not a timed test): latency the live proxy adds to streamed chat completions, at
1, 16 and 64 concurrent streaming clients, side by side with LiteLLM's proxy on the same
llama-server, the same requests and the same client, in one run.

Everything listens on 127.0.0.1 only. `triage proxy` and LiteLLM run as their own processes
(as deployed), each with its recording / logging defaults. LiteLLM is installed only into
this benchmark's own venv ($TRIAGE_CACHE_DIR or ~/.cache/triage, `bench-litellm`), never
into the project; if it cannot be installed, the table says so.

What is measured, and how it is kept from measuring something else:

- The load generator must not be the bottleneck: it is a lean asyncio HTTP/1.1 client (one
  connection per request, `Connection: close`, the same for every target) on uvloop. An
  httpx client spent 1.4 s of CPU on 648 direct streams at 64 clients and 4.1 s on the same
  streams through a proxy (more, smaller reads): it was measuring itself.
- llama-server gets CPUs of its own: on a host with 2 or more CPUs it is pinned to the first
  half, the client and the proxies to the other half (`TRIAGE_BENCH_PIN=0` turns this off).
  Unpinned, at 64 clients the 2 CPUs of the reference machine are saturated by llama-server
  and the client alone, so any CPU a proxy spends shows up as queueing inside llama-server,
  a cost of the machine's size, not of the proxy (a real deployment decodes on a GPU or on
  cores of its own).
- Rounds are interleaved: each load runs `ROUNDS` rounds, each round every target in turn
  (the order rotated between rounds), so a change in the machine's background load hits all
  targets alike. Percentiles are over all rounds' requests; the added latency is the
  target's percentile minus direct's, with a 95% bootstrap interval (requests resampled
  within each target); the spread of direct's p99 between rounds is printed as the noise
  floor a difference must exceed to mean anything.

Run with `make bench`; the table is printed with the machine it ran on.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from triage.drills import build_drill, gateways
from triage.llama.build import find_server_binary
from triage.llama.launcher import RunningServer, ServerSpec, start

pytestmark = [pytest.mark.bench, pytest.mark.integration, pytest.mark.timeout(0)]

LOADS = (1, 16, 64)
REQUESTS = {1: 100, 16: 320, 64: 640}  # per target and round
ROUNDS = int(os.environ.get("TRIAGE_BENCH_ROUNDS", "3"))
WARMUP = 8
BOOTSTRAP = 2000
MAX_TOKENS = 24
SERVER_ARGS = ["-c", "16384", "-np", "64", "-t", "1", "-tb", "1"]
MASTER_KEY = "sk-bench-" + "0" * 32  # LiteLLM refuses to start without one
BODY = {
    "model": "drill",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": MAX_TOKENS,
    "temperature": 0.0,
    "stream": True,
    "chat_template_kwargs": {"enable_thinking": False},
}


def _cache_dir() -> Path:
    env = os.environ.get("TRIAGE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "triage"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not become ready in {timeout} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def litellm_binary() -> tuple[Path | None, str]:
    """LiteLLM's `litellm` in its own venv, installed on first use (shared with the gateway
    drill: triage.drills.gateways)."""
    try:
        return gateways.litellm_binary(), ""
    except gateways.GatewayError as exc:
        return None, str(exc)


async def _one(host: str, port: int, request: bytes, name: str) -> float | None:
    """Seconds from connecting to the last byte of one streamed reply, or None for a failed
    request (counted, not timed; printed with the target's name, `direct` is llama-server
    itself). One connection per request (`Connection: close`, the same for every target):
    the reply ends when the target closes it, and must end with the stream's `[DONE]`."""
    started = time.perf_counter()
    tail = b""
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            while chunk := await reader.read(65536):
                tail = (tail + chunk)[-256:]
        finally:
            writer.close()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
        return None
    elapsed = time.perf_counter() - started
    if head[9:12] != b"200" or b"[DONE]" not in tail:
        print(f"{name}: {head[:12]!r}, reply ends {tail[-40:]!r}")
        return None
    return elapsed


def _request_bytes(host: str, port: int, headers: dict[str, str]) -> bytes:
    body = json.dumps(BODY).encode()
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        "Connection: close",
        f"Content-Length: {len(body)}",
        *[f"{k}: {v}" for k, v in headers.items()],
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _load_async(
    base: str, concurrency: int, total: int, headers: dict[str, str], name: str
) -> list[float | None]:
    url = urlsplit(base)
    host, port = url.hostname or "127.0.0.1", int(url.port or 80)
    request = _request_bytes(host, port, headers)
    for _ in range(WARMUP):
        await _one(host, port, request, name)
    queue = list(range(total))
    times: list[float | None] = []

    async def worker() -> None:
        while queue:
            queue.pop()
            times.append(await _one(host, port, request, name))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


def _load(
    base: str, concurrency: int, total: int, headers: dict[str, str], name: str = ""
) -> list[float | None]:
    """`total` streamed requests to `base`, `concurrency` at a time (uvloop when installed)."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_load_async(base, concurrency, total, headers, name or base))


HISTOGRAMS = ("triage_proxy_overhead_seconds", "triage_proxy_event_loop_lag_seconds")


def _histograms(base: str) -> dict[str, dict[float, float]]:
    """Cumulative counts of the proxy's own overhead histogram (streamed requests) and of its
    event-loop lag (`/metrics`): {name: {upper bound in seconds: observations at or below}}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=30).text
    counts: dict[str, dict[float, float]] = {name: {} for name in HISTOGRAMS}
    for family in text_string_to_metric_families(text):
        if family.name not in counts:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.labels.get("stream", "true") == "true":
                bound = float(sample.labels["le"])
                counts[family.name][bound] = counts[family.name].get(bound, 0.0) + sample.value
    return counts


def _bucket_percentile(before: dict[float, float], after: dict[float, float], q: float) -> str:
    """The smallest bucket bound under which q% of the run's requests fell (from the
    histogram's counts before and after the run): a bound, not an estimate."""
    diff = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = diff[-1][1] if diff else 0.0
    for bound, count in diff:
        if total and count >= total * q / 100:
            return "> 1 s" if bound == float("inf") else f"<= {bound * 1000:g} ms"
    return "n/a"


def _cpu_split() -> tuple[set[int], set[int]] | None:
    """(llama-server's CPUs, the client's and proxies' CPUs), or None: pinning off, or fewer
    than 2 CPUs available."""
    if os.environ.get("TRIAGE_BENCH_PIN", "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def _pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a running process (affinity is per thread on Linux; threads it
    starts later inherit their creator's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by a process and all its descendants, from
    /proc: unlike latency, barely moved by other jobs on a shared machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    family, total = {pid}, 0.0
    for _ in range(4):  # children, grandchildren, ...
        family |= {child for child, (parent, _) in stats.items() if parent in family}
    for member in family:
        total += stats.get(member, (0, 0.0))[1]
    return total


def _settled_cpu_seconds(pid: int, timeout: float = 30.0) -> float:
    """`_cpu_seconds` once the process has gone idle (its background recording of the load
    done), polled every 0.5 s for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    used = _cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_seconds(pid)
        if now - used < 0.02:
            return now
        used = now
    return used


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("bench-proxy")
    drill = build_drill("gemma4-toolcall", folder / "drill")
    server = start(ServerSpec(find_server_binary(), drill.model, SERVER_ARGS), folder / "logs")
    try:
        yield server
    finally:
        server.stop()


def _start_triage_proxy(upstream: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "TRIAGE_DATABASE_URL": f"sqlite:///{folder / 'kb.db'}"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "triage.cli",
            "proxy",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            "--spool",
            str(folder / "spool.jsonl"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(folder / "proxy.log").open("wb"),
    )
    return process, f"http://127.0.0.1:{port}"


def _start_litellm(
    binary: Path, upstream: str, folder: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: drill\n"
        "    litellm_params:\n"
        "      model: openai/drill\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    env = {**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    process = subprocess.Popen(
        [
            str(binary),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(folder / "litellm.log").open("wb"),
    )
    return process, f"http://127.0.0.1:{port}"


def test_added_latency_vs_direct_and_litellm(upstream: RunningServer, tmp_path: Path) -> None:
    split = _cpu_split()
    own_cpus = os.sched_getaffinity(0) if split else set()
    if split:
        _pin(upstream.pid, split[0])
        os.sched_setaffinity(0, split[1])  # the proxies started below inherit it
    processes: list[subprocess.Popen[bytes]] = []
    try:
        targets, pids, note = _start_targets(upstream.base_url, tmp_path, processes)
        loadavg_before = os.getloadavg()
        overhead: dict[int, dict[str, dict[float, float]]] = {}
        results, cpu = _run_rounds(targets, pids, overhead)
    finally:
        for process in processes:
            _stop(process)
        if split:
            os.sched_setaffinity(0, own_cpus)
    _print_table(results, note, (loadavg_before, os.getloadavg()), split)
    print(
        "The proxy's own share (its overhead histogram: arrival to upstream call, plus last "
        "upstream byte read to last byte written) and its event-loop lag (how late a 50 ms "
        "sleep wakes up, 20 times a second):"
    )
    for load in LOADS:
        own, lag = (overhead.get(load, {}).get(metric, {}) for metric in HISTOGRAMS)
        if own and lag:
            p50, p99 = (_bucket_percentile({}, own, q) for q in (50, 99))
            lag50, lag99 = (_bucket_percentile({}, lag, q) for q in (50, 99))
            print(
                f"  {load} clients: overhead p50 {p50}, p99 {p99}; "
                f"loop lag p50 {lag50}, p99 {lag99}"
            )
    print("CPU per request (the process and its children, ms; recording included):")
    for (name, load), value in sorted(cpu.items()):
        print(f"  {name} at {load} clients: {value:.2f}")
    failed = any(r.failed for r in results.values())
    for name in ("proxy.log", "litellm.log"):
        if (tmp_path / name).exists() and failed:
            print(f"--- last lines of {name}")
            print("\n".join((tmp_path / name).read_text(errors="replace").splitlines()[-15:]))
    assert all(results[("direct", load)].p50 > 0 for load in LOADS)


def _start_targets(
    upstream: str, folder: Path, processes: list[subprocess.Popen[bytes]]
) -> tuple[dict[str, tuple[str, dict[str, str]]], dict[str, int], str]:
    """direct, `triage proxy` and (when it installs) LiteLLM: {name: (base, headers)}, the
    proxies' pids, and why LiteLLM is missing (or "")."""
    targets: dict[str, tuple[str, dict[str, str]]] = {"direct": (upstream, {})}
    pids: dict[str, int] = {}
    proxy, proxy_url = _start_triage_proxy(upstream, folder)
    processes.append(proxy)
    _wait_ready(f"{proxy_url}/health", proxy)
    targets["triage proxy"] = (proxy_url, {})
    pids["triage proxy"] = proxy.pid
    binary, note = litellm_binary()
    if binary is not None:
        litellm, litellm_url = _start_litellm(binary, upstream, folder)
        processes.append(litellm)
        try:
            _wait_ready(f"{litellm_url}/health/liveliness", litellm)
            targets["LiteLLM"] = (litellm_url, {"Authorization": f"Bearer {MASTER_KEY}"})
            pids["LiteLLM"] = litellm.pid
        except RuntimeError as exc:
            note = f"LiteLLM did not start: {exc}"
    return targets, pids, note


class _Result:
    """One target at one load, all rounds pooled: percentiles in ms, failures, and each
    round's p99 (their spread is the noise between rounds)."""

    def __init__(self, times: list[float | None], round_p99: list[float]) -> None:
        ok = [t for t in times if t is not None]
        self.ms = np.array(ok or [float("nan")]) * 1000
        self.failed = len(times) - len(ok)
        self.p50 = float(np.percentile(self.ms, 50))
        self.p99 = float(np.percentile(self.ms, 99))
        self.round_p99 = round_p99


def _run_rounds(
    targets: dict[str, tuple[str, dict[str, str]]],
    pids: dict[str, int],
    overhead: dict[int, dict[str, dict[float, float]]],
) -> tuple[dict[tuple[str, int], _Result], dict[tuple[str, int], float]]:
    """Every load, ROUNDS interleaved rounds (each target once per round, the order rotated
    between rounds); CPU per request of each proxy process, settled after each run (its
    recording of that run's exchanges included); `overhead` gets the counts of the proxy's own
    overhead histogram per load."""
    results: dict[tuple[str, int], _Result] = {}
    cpu: dict[tuple[str, int], float] = {}
    names = list(targets)
    for load in LOADS:
        overhead[load] = {}
        times: dict[str, list[float | None]] = {name: [] for name in names}
        round_p99: dict[str, list[float]] = {name: [] for name in names}
        used: dict[str, float] = {name: 0.0 for name in names}
        for index in range(ROUNDS):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                base, headers = targets[name]
                pid = pids.get(name)
                watch = overhead[load] if name == "triage proxy" else None
                run, seconds = _one_run(base, headers, load, name, pid, watch)
                used[name] += seconds
                times[name].extend(run)
                round_p99[name].append(_Result(run, []).p99)
        for name in names:
            results[(name, load)] = _Result(times[name], round_p99[name])
            if name in pids:
                cpu[(name, load)] = used[name] * 1000 / ((REQUESTS[load] + WARMUP) * ROUNDS)
    return results, cpu


def _one_run(
    base: str,
    headers: dict[str, str],
    load: int,
    name: str,
    pid: int | None,
    histograms: dict[str, dict[float, float]] | None,
) -> tuple[list[float | None], float]:
    """One target's run at one load: its times, the CPU seconds its process used (settled:
    recording included), and the run's counts added into `histograms` (the triage proxy's)."""
    before = _cpu_seconds(pid) if pid else 0.0
    counts_before = _histograms(base) if histograms is not None else {}
    run = _load(base, load, REQUESTS[load], headers, name)
    if histograms is not None:
        for metric, after in _histograms(base).items():
            into = histograms.setdefault(metric, {})
            for bound, count in after.items():
                into[bound] = into.get(bound, 0.0) + count - counts_before[metric].get(bound, 0.0)
    return run, (_settled_cpu_seconds(pid) - before) if pid else 0.0


def _added(target: _Result, direct: _Result, q: float, rng: np.random.Generator) -> str:
    """Target's percentile minus direct's, in ms, with a 95% bootstrap interval."""
    point = float(np.percentile(target.ms, q) - np.percentile(direct.ms, q))
    resampled_target = rng.choice(target.ms, (BOOTSTRAP, target.ms.size))
    resampled_direct = rng.choice(direct.ms, (BOOTSTRAP, direct.ms.size))
    diffs = np.percentile(resampled_target, q, axis=1) - np.percentile(resampled_direct, q, axis=1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return f"{point:+.2f} [{low:+.1f}, {high:+.1f}]"


def _print_table(
    results: dict[tuple[str, int], _Result],
    note: str,
    loadavg: tuple[tuple[float, ...], tuple[float, ...]],
    split: tuple[set[int], set[int]] | None,
) -> None:
    """The table, headed by the machine, its load (1/5/15-min load averages before and
    after the run: on a shared machine the numbers mean little without it) and the CPU
    split."""
    before, after = (" / ".join(f"{v:.2f}" for v in values) for values in loadavg)
    pinned = (
        f"llama-server pinned to CPUs {sorted(split[0])}, client and proxies to {sorted(split[1])}"
        if split
        else "nothing pinned"
    )
    print()
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; streamed chat completions of {MAX_TOKENS} "
        f"tokens, llama-server b11434 `{' '.join(SERVER_ARGS)}`; {pinned}; {ROUNDS} "
        f"interleaved rounds; load average {before} before, {after} after"
    )
    print(
        "| clients | requests per target | direct p50 / p99 ms (p99 of each round) "
        "| triage proxy added p50 / p99 ms [95% CI] | LiteLLM added p50 / p99 ms [95% CI] |"
    )
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for load in LOADS:
        direct = results[("direct", load)]
        errors = f" ({direct.failed} failed)" if direct.failed else ""
        rounds = ", ".join(f"{v:.0f}" for v in direct.round_p99)
        cells = [
            f"{load}",
            f"{REQUESTS[load] * ROUNDS}",
            f"{direct.p50:.1f} / {direct.p99:.1f} ({rounds}){errors}",
        ]
        for name in ("triage proxy", "LiteLLM"):
            if (name, load) not in results:
                cells.append(note or "not run")
                continue
            result = results[(name, load)]
            errors = f" ({result.failed} failed)" if result.failed else ""
            p50 = _added(result, direct, 50, rng)
            p99 = _added(result, direct, 99, rng)
            cells.append(f"{p50} / {p99}{errors}")
        print("| " + " | ".join(cells) + " |")
