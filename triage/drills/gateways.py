"""Real gateways in front of a real llama-server, for the gateway drills, their tests and the
proxy benchmark: nginx (the Debian package) and the LiteLLM proxy (PyPI `litellm[proxy]`,
installed on first use into its own venv under the cache, never into the project's).

Each runs as a child process on a free loopback port with a short read timeout, its
config, temp files, pid and logs in a folder of the caller's; `running_gateway` stops it
when the block ends, also on failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "GATEWAYS",
    "LITELLM_KEY_ENV",
    "LITELLM_MODEL",
    "Gateway",
    "GatewayError",
    "free_port",
    "litellm_binary",
    "nginx_binary",
    "running_gateway",
]

LITELLM_MODEL = "drill"  # the model name a request through LiteLLM must carry
# The environment variable the LiteLLM gateway's key is read from (stack `api_key_env`).
LITELLM_KEY_ENV = "TRIAGE_DRILL_LITELLM_KEY"
LITELLM_KEY = "sk-drill-" + "0" * 32  # LiteLLM refuses to start without a master key
# LiteLLM imports for a minute on a quiet 2-core machine, and for more than three under a load
# of 12 (measured: a confusion run beside eight test runs gave up at 180 s with nothing
# logged). The wait is still bounded; TRIAGE_GATEWAY_READY_S sets another bound.
READY_TIMEOUT = 600.0
READY_TIMEOUT_ENV = "TRIAGE_GATEWAY_READY_S"
GATEWAYS = ("nginx", "litellm")


class GatewayError(RuntimeError):
    """A gateway that cannot be installed or started here (the message says why)."""


@dataclass
class Gateway:
    """A gateway process: its URL, and the key a client must send (None: no key)."""

    kind: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    read_timeout: float
    api_key: str | None = field(default=None, repr=False)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


def _cache_dir() -> Path:
    env = os.environ.get("TRIAGE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "triage"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nginx_binary() -> Path:
    """The nginx executable (Debian's package puts it in /usr/sbin)."""
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None
    )
    if found is None:
        raise GatewayError("nginx is not installed (Debian package `nginx`)")
    return Path(found)


def litellm_binary() -> Path:
    """LiteLLM's `litellm` script in its own venv under the cache, installed on first use
    (a few minutes; PyPI `litellm[proxy]`)."""
    venv = _cache_dir() / "bench-litellm"
    binary = venv / "bin" / "litellm"
    if binary.exists():
        return binary
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            check=True,
            timeout=1800,
            capture_output=True,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        raise GatewayError(f"LiteLLM could not be installed here ({type(exc).__name__})") from exc
    if not binary.exists():
        raise GatewayError("LiteLLM installed no `litellm` script")
    return binary


def _nginx_config(folder: Path, port: int, upstream: str, read_timeout: float) -> Path:
    temp = folder / "temp"
    temp.mkdir(parents=True, exist_ok=True)
    upstream_host = upstream.split("://", 1)[-1].rstrip("/")
    config = folder / "nginx.conf"
    # One process, no daemon: it runs as the caller (also as root), and stops with us.
    config.write_text(
        f"""daemon off;
master_process off;
worker_processes 1;
pid {folder / "nginx.pid"};
error_log {folder / "nginx.log"} warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  client_max_body_size 64m;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://{upstream_host};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout {max(1, round(read_timeout * 1000))}ms;
    }}
  }}
}}
"""
    )
    return config


def _start_nginx(folder: Path, upstream: str, read_timeout: float) -> Gateway:
    port = free_port()
    config = _nginx_config(folder, port, upstream, read_timeout)
    log = folder / "nginx.log"
    process = subprocess.Popen(
        [str(nginx_binary()), "-p", str(folder), "-c", str(config), "-e", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "nginx.stderr").open("wb"),
    )
    return Gateway("nginx", f"http://127.0.0.1:{port}", process, log, read_timeout)


def _start_litellm(folder: Path, upstream: str, read_timeout: float) -> Gateway:
    binary = litellm_binary()
    port = free_port()
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {LITELLM_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{LITELLM_MODEL}\n"
        f"      api_base: {upstream.rstrip('/')}/v1\n"
        "      api_key: none\n"
        f"      timeout: {read_timeout}\n"
        f"      stream_timeout: {read_timeout}\n"
        "      max_retries: 0\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        f"  request_timeout: {read_timeout}\n"
        "  num_retries: 0\n"
        "router_settings:\n"
        "  num_retries: 0\n"
    )
    log = folder / "litellm.log"
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_DOCS": "True",
    }
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
        stderr=log.open("wb"),
    )
    return Gateway(
        "litellm", f"http://127.0.0.1:{port}", process, log, read_timeout, api_key=LITELLM_KEY
    )


def ready_timeout() -> float:
    """How long a gateway may take to answer after its start (TRIAGE_GATEWAY_READY_S, a
    positive number of seconds, else READY_TIMEOUT)."""
    raw = os.environ.get(READY_TIMEOUT_ENV, "").strip()
    if not raw:
        return READY_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise GatewayError(f"{READY_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not 0 < value <= 24 * 3600:
        raise GatewayError(f"{READY_TIMEOUT_ENV}={raw!r} must be between 0 and 86400 seconds")
    return value


def _wait_ready(gateway: Gateway, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            raise GatewayError(
                f"{gateway.kind} exited with {gateway.process.returncode}: {gateway.log_tail()}"
            )
        try:
            if httpx.get(gateway.url + path, timeout=5).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise GatewayError(
        f"{gateway.kind} did not answer within {timeout:g} s (a busy machine may need more: "
        f"set {READY_TIMEOUT_ENV}): {gateway.log_tail()}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running_gateway(
    kind: str, upstream: str, folder: Path, read_timeout: float
) -> Iterator[Gateway]:
    """nginx or LiteLLM on a free loopback port in front of `upstream` (llama-server's URL)
    with a read timeout of `read_timeout` seconds; stopped when the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "nginx":
        gateway, ready = _start_nginx(folder, upstream, read_timeout), "/health"
    elif kind == "litellm":
        gateway, ready = _start_litellm(folder, upstream, read_timeout), "/health/liveliness"
    else:
        raise GatewayError(f"unknown gateway {kind!r}; known: {', '.join(GATEWAYS)}")
    try:
        _wait_ready(gateway, ready, ready_timeout())
        yield gateway
    finally:
        _stop(gateway.process)
