"""Benchmark (not a timed test): latency the live proxy adds to streamed chat completions, at
1, 16 and 64 concurrent streaming clients, side by side with LiteLLM's proxy on the same
llama-server, the same requests and the same client, in one run.

Everything listens on 127.0.0.1 only. `triage proxy` and LiteLLM run as their own processes
(as deployed), each with its recording / logging defaults. LiteLLM is installed only into
this benchmark's own venv ($TRIAGE_CACHE_DIR or ~/.cache/triage, `bench-litellm`), never
into the project; if it cannot be installed, the table says so.

For each target and load: `requests` streamed requests (bounded), the time from sending the
request to the last byte; added latency = target's percentile - direct percentile at the
same load. Run with `make bench`; the table is printed with the machine it ran on.
"""

from __future__ import annotations

import asyncio
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

import httpx
import numpy as np
import pytest

from triage.drills import build_drill
from triage.llama.build import find_server_binary
from triage.llama.launcher import ServerSpec, start

pytestmark = [pytest.mark.bench, pytest.mark.integration, pytest.mark.timeout(0)]

LOADS = (1, 16, 64)
REQUESTS = {1: 100, 16: 320, 64: 640}
WARMUP = 8
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
    """LiteLLM's `litellm` in the benchmark's own venv, installed on first use."""
    venv = _cache_dir() / "bench-litellm"
    binary = venv / "bin" / "litellm"
    if binary.exists():
        return binary, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            check=True,
            timeout=1800,
            capture_output=True,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"LiteLLM could not be installed here ({type(exc).__name__})"
    return (binary, "") if binary.exists() else (None, "LiteLLM installed no `litellm` script")


async def _one(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], name: str = ""
) -> float | None:
    """Seconds to the last byte, or None for a failed request (counted, not timed); a
    failure is printed with the target's name (`direct` is llama-server itself)."""
    started = time.perf_counter()
    try:
        async with client.stream("POST", url, json=BODY, headers=headers) as response:
            async for _ in response.aiter_raw():
                pass
    except httpx.HTTPError as exc:
        print(f"{name or url}: {type(exc).__name__}: {exc}")
        return None
    if response.status_code != 200:
        print(f"{name or url}: HTTP {response.status_code}")
        return None
    return time.perf_counter() - started


async def _load(
    base: str, concurrency: int, total: int, headers: dict[str, str], name: str = ""
) -> list[float | None]:
    url = f"{base}/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        for _ in range(WARMUP):
            await _one(client, url, headers, name)
        queue = list(range(total))
        times: list[float | None] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                times.append(await _one(client, url, headers, name))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


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


def _percentiles(times: list[float | None]) -> tuple[float, float, int]:
    """p50 and p99 in ms of the requests that succeeded, and how many failed."""
    ok = [t for t in times if t is not None]
    values = np.array(ok or [float("nan")]) * 1000
    return (
        float(np.percentile(values, 50)),
        float(np.percentile(values, 99)),
        len(times) - len(ok),
    )


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("bench-proxy")
    drill = build_drill("gemma4-toolcall", folder / "drill")
    server = start(ServerSpec(find_server_binary(), drill.model, SERVER_ARGS), folder / "logs")
    try:
        yield server.base_url
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


def test_added_latency_vs_direct_and_litellm(upstream: str, tmp_path: Path) -> None:
    targets: dict[str, tuple[str, dict[str, str]]] = {"direct": (upstream, {})}
    processes = []
    pids: dict[str, int] = {}
    note = ""
    try:
        proxy, proxy_url = _start_triage_proxy(upstream, tmp_path)
        processes.append(proxy)
        _wait_ready(f"{proxy_url}/health", proxy)
        targets["triage proxy"] = (proxy_url, {})
        pids["triage proxy"] = proxy.pid
        binary, note = litellm_binary()
        if binary is not None:
            litellm, litellm_url = _start_litellm(binary, upstream, tmp_path)
            processes.append(litellm)
            try:
                _wait_ready(f"{litellm_url}/health/liveliness", litellm)
                targets["LiteLLM"] = (litellm_url, {"authorization": f"Bearer {MASTER_KEY}"})
                pids["LiteLLM"] = litellm.pid
            except RuntimeError as exc:
                note = f"LiteLLM did not start: {exc}"
        results: dict[tuple[str, int], tuple[float, float, int]] = {}
        cpu: dict[tuple[str, int], float] = {}  # ms of CPU per request
        loadavg_before = os.getloadavg()
        for load in LOADS:
            for name, (base, headers) in targets.items():
                before = _cpu_seconds(pids[name]) if name in pids else 0.0
                times = asyncio.run(_load(base, load, REQUESTS[load], headers, name))
                results[(name, load)] = _percentiles(times)
                if name in pids:
                    used = _settled_cpu_seconds(pids[name]) - before
                    cpu[(name, load)] = used * 1000 / (REQUESTS[load] + WARMUP)
    finally:
        for process in processes:
            _stop(process)
    _print_table(results, targets, note, (loadavg_before, os.getloadavg()))
    print("CPU per request (the process and its children, ms; recording included):")
    for (name, load), value in sorted(cpu.items()):
        print(f"  {name} at {load} clients: {value:.2f}")
    for name in ("proxy.log", "litellm.log"):
        if (tmp_path / name).exists() and any(r[2] for r in results.values()):
            print(f"--- last lines of {name}")
            print("\n".join((tmp_path / name).read_text(errors="replace").splitlines()[-15:]))
    assert all(results[("direct", load)][0] > 0 for load in LOADS)


def _print_table(
    results: dict[tuple[str, int], tuple[float, float, int]],
    targets: dict[str, Any],
    note: str,
    loadavg: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    """The table, headed by the machine and its load (1/5/15-min load averages before and
    after the run: on a shared machine the numbers mean little without it)."""
    before, after = (" / ".join(f"{v:.2f}" for v in values) for values in loadavg)
    print()
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; streamed chat completions of {MAX_TOKENS} "
        f"tokens, llama-server b11434 `{' '.join(SERVER_ARGS)}`; load average "
        f"{before} before, {after} after"
    )
    print(
        "| clients | requests | direct p50 / p99 ms | triage proxy added p50 / p99 ms "
        "| LiteLLM added p50 / p99 ms |"
    )
    print("|---|---|---|---|---|")
    for load in LOADS:
        d50, d99, direct_failed = results[("direct", load)]
        errors = f" ({direct_failed} failed)" if direct_failed else ""
        cells = [f"{load}", f"{REQUESTS[load]}", f"{d50:.1f} / {d99:.1f}{errors}"]
        for name in ("triage proxy", "LiteLLM"):
            if (name, load) in results:
                p50, p99, failed = results[(name, load)]
                errors = f" ({failed} failed)" if failed else ""
                cells.append(f"{p50 - d50:+.2f} / {p99 - d99:+.2f}{errors}")
            else:
                cells.append(note or "not run")
        print("| " + " | ".join(cells) + " |")
