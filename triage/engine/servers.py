"""Server lifecycle: launch (or attach to) one configuration, health, death; always stopped."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from triage.capture import redact_args, redaction_marker
from triage.capture.redact import SECRET_SERVER_FLAGS, redact_url
from triage.llama import client as llama_client
from triage.llama.build import find_server_binary
from triage.llama.client import LlamaClientError
from triage.llama.flags import binary_flags, unknown_flags
from triage.llama.grammar_log import GrammarLog
from triage.llama.launcher import ServerSpec, launch
from triage.stackfile import PATH_VALUE_FLAGS, ServerConfig, ServerDescription

__all__ = [
    "EngineError",
    "Server",
    "api_key_from_args",
    "check_flags",
    "check_gateway",
    "gateway_server",
    "open_server",
    "resolve_binary",
    "safe_args",
    "safe_describe",
    "safe_stack_raw",
    "scrub_secrets",
    "secret_values",
]

API_KEY_FILE_MAX = 64 * 1024  # bytes read from an --api-key-file


class EngineError(Exception):
    """The engine cannot start (bad stack, no binary, no failing exchange)."""


@dataclass
class Server:
    key: str
    config: ServerConfig
    base_url: str
    slots: int
    launch_seconds: float
    handle: Any = None  # RunningServer, None for an external url
    # The server's `--api-key` (in memory only): replays send it as `Authorization: Bearer`.
    api_key: str | None = field(default=None, repr=False)
    failure: Any = None  # the CrashReport once it crashed mid-request or hung (explain)
    pace: Any = None  # its measured speed and /slots progress (triage.engine.pacing)
    grammar_log: GrammarLog | None = None  # its log's grammar lines (triage.engine.server_log)

    def alive(self) -> bool:
        return self.handle is None or bool(self.handle.alive())

    def log_tail(self) -> str:
        if self.handle is None:
            return ""
        try:
            return str(self.handle.log_tail(20))
        except Exception:  # noqa: BLE001 - best effort for an error message
            return ""

    def death_message(self) -> str:
        report = self.failure or self.crash_report()
        if report is not None:
            return f"server {server_label(self.config)}: {report.sentence()}"
        code = getattr(self.handle, "returncode", None) if self.handle else None
        return f"server {server_label(self.config)} died (exit code {code})"

    def crash_report(self) -> Any | None:
        """The launcher's CrashReport of a server that has exited, else None."""
        if self.handle is None or self.alive() or not hasattr(self.handle, "crash_report"):
            return None
        try:
            return self.handle.crash_report()
        except Exception:  # noqa: BLE001 - best effort for an error message
            return None

    def explain(self, error: str, timed_out: bool = False) -> Any | None:
        """After a request failed with `error`: the CrashReport when the server is why --
        it died (phase "mid-request") or it still runs but the request timed out (phase
        "hang"; the server is then stopped) -- else None (an external url: None)."""
        if self.handle is None or not hasattr(self.handle, "explain"):
            return None
        exc: BaseException = TimeoutError(error) if timed_out else ConnectionError(error)
        failure = self.handle.explain(exc)
        report = getattr(failure, "report", None) if failure is not None else None
        if report is not None and self.failure is None:
            self.failure = report
        return report


def safe_args(args: Sequence[str]) -> list[str]:
    """Server arguments fit to record, print or log: secret flag values masked."""
    return redact_args([str(a) for a in args])


def safe_describe(config: ServerConfig) -> ServerDescription:
    """`config.describe()` with its secret flag values masked."""
    described = config.describe()
    described["args"] = safe_args(described["args"])
    if described.get("url"):
        described["url"] = redact_url(str(described["url"]))
    return described


def server_label(config: ServerConfig) -> str:
    """One line naming a server configuration for messages (never a Python dict): its
    model file and args (secret values masked), or its URL."""
    described = safe_describe(config)
    if described.get("model"):
        name = str(described["model"]).rsplit("/", 1)[-1]
        args = " ".join(str(a) for a in described.get("args") or [])
        return f"{name} {args}".strip()[:300]
    return f"at {described.get('url') or '?'}"


def safe_stack_raw(raw: Any) -> Any:
    """A parsed stack file with every `args` list's secret flag values masked (for the
    run plan; `--resume` reads the stack file again, so nothing needs the real values)."""
    if isinstance(raw, dict):
        return {
            k: safe_args(v)
            if k == "args" and isinstance(v, list)
            else redact_url(v)
            if k == "url" and isinstance(v, str)
            else safe_stack_raw(v)
            for k, v in raw.items()
        }
    if isinstance(raw, list):
        return [safe_stack_raw(v) for v in raw]
    return raw


def secret_values(args: Sequence[str]) -> list[str]:
    """The values of the secret flags in `args` (and the key an `--api-key-file` holds):
    what must be scrubbed from any message, log tail or fact the engine records."""
    args = [str(a) for a in args]
    found: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag not in SECRET_SERVER_FLAGS:
            continue
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        found += [v for v in [value, *value.split(",")] if len(v.strip()) >= 4]
    try:
        key = api_key_from_args(args)
    except EngineError:
        key = None
    if key:
        found.append(key)
    return sorted(set(found), key=len, reverse=True)


def scrub_secrets(value: Any, secrets: Sequence[str]) -> Any:
    """`value` (a string, or dicts/lists of them) with every secret replaced by its
    redaction marker -- for messages that quote an argv (a launcher error, a log tail)."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, redaction_marker(secret))
        return value
    if isinstance(value, dict):
        return {k: scrub_secrets(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub_secrets(v, secrets) for v in value)
    return value


def api_key_from_args(args: Sequence[str]) -> str | None:
    """The key a server launched with `args` demands: `--api-key KEY[,KEY2]`,
    `--api-key=KEY` or the first line of `--api-key-file F`; None without one."""
    args = [str(a) for a in args]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag not in ("--api-key", "--api-key-file"):
            continue
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
        if flag == "--api-key-file":
            try:
                with open(value, "rb") as fh:
                    text = fh.read(API_KEY_FILE_MAX).decode("utf-8", errors="replace")
            except OSError as exc:
                raise EngineError(f"--api-key-file: cannot read it: {exc.strerror}") from None
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            return lines[0] if lines else None
        return value.split(",")[0].strip() or None
    return None


def resolve_binary(binary: Path | None) -> Path:
    """The llama-server binary of a configuration: a path, a name on PATH, or the built one."""
    if binary is not None and "/" in str(binary):
        return Path(binary)
    if binary is None or str(binary) == "llama-server" and shutil.which("llama-server") is None:
        return find_server_binary()
    found = shutil.which(str(binary))
    if found is None:
        raise EngineError(f"binary {str(binary)!r} not found on PATH")
    return Path(found)


@contextmanager
def open_server(config: ServerConfig, log_dir: Path, ready_timeout: float) -> Iterator[Server]:
    """Launch (or attach to) one server configuration; always stopped on exit."""
    if config.model is None and config.url:
        yield Server(
            config.key(),
            config,
            config.url.rstrip("/"),
            1,
            0.0,
            api_key=api_key_from_args(config.args),
        )
        return
    if config.model is None:
        raise EngineError("the server configuration has neither a model nor a url")
    api_key = api_key_from_args(config.args)
    spec = ServerSpec(
        binary=resolve_binary(config.binary), model=Path(config.model), args=list(config.args)
    )
    with launch(spec, log_dir=log_dir, ready_timeout=ready_timeout) as running:
        yield Server(
            config.key(),
            config,
            running.base_url,
            1,
            float(getattr(running, "launch_seconds", 0.0) or 0.0),
            running,
            api_key=api_key,
        )


RESERVED_FLAGS = ("--host", "--port", "-m", "--model")


def check_config(config: ServerConfig, where: str) -> None:
    """Refuse, before anything launches, a configuration that cannot start: flags the
    launcher owns, missing model or flag files, a binary that does not exist."""
    args = list(config.args)
    clashes = sorted({a.split("=", 1)[0] for a in args} & set(RESERVED_FLAGS))
    if clashes:
        raise EngineError(
            f"{where}: args must not set {', '.join(clashes)}: the engine "
            "chooses the model, host and port of every server it launches"
        )
    if config.model is None:
        return
    if not Path(config.model).is_file():
        raise EngineError(f"{where}: model file not found: {config.model}")
    for flag, value in zip(args, args[1:], strict=False):
        if flag in PATH_VALUE_FLAGS and flag != "--slot-save-path" and not Path(value).exists():
            raise EngineError(f"{where}: {flag} file not found: {value}")
    try:
        binary = resolve_binary(config.binary)
    except EngineError as exc:
        raise EngineError(f"{where}: {exc}") from None
    except Exception as exc:  # no built binary and no $LLAMA_SERVER_BIN
        raise EngineError(f"{where}: {exc}") from None
    check_flags(binary, args, where)


def check_flags(binary: Path, args: Sequence[str], where: str) -> None:
    """Refuse args the binary's own `--help` does not list (named, with the closest known
    spelling), before anything launches: such a server would exit at startup with
    "invalid argument". Nothing is checked when the binary's usage cannot be read."""
    unknown = unknown_flags(args, binary_flags(binary))
    if unknown:
        raise EngineError(
            f"{where}.args: {binary.name} ({binary}) does not know "
            + ", ".join(u.text() for u in unknown)
            + ": its --help lists no such flag, so it would exit at startup (server-flags)"
        )


def gateway_server(stack: Any, base: Server) -> Server:
    """Where the client's requests went: the stack's `[gateway]` (LiteLLM, nginx... in front
    of `base`), else `base` itself. The gateway forwards to `base`, so it has its slots."""
    gateway = getattr(stack, "gateway", None)
    if gateway is None:
        return base
    return Server(
        f"gateway {gateway.url}",
        ServerConfig(url=gateway.url),
        gateway.url.rstrip("/"),
        base.slots,
        0.0,
        api_key=gateway.api_key(),
    )


def check_gateway(gateway: Any, timeout: float = 5.0) -> None:
    """The stack's gateway must accept a connection before a run records anything (any
    HTTP answer will do: a gateway's own routes differ, /health may need a key)."""
    try:
        with httpx.Client(timeout=timeout) as client:
            client.get(gateway.url)
    except httpx.HTTPError as exc:
        raise EngineError(
            f"$.gateway.url: {gateway.url} does not answer ({type(exc).__name__}: {exc})"
        ) from None


def check_url(url: str, timeout: float = 5.0) -> None:
    """A running server at `url` must answer /health before a run records anything."""

    async def probe() -> int:
        async with llama_client.LlamaClient(url, timeout=timeout) as client:
            return int((await client.health(timeout=timeout)).status_code)

    try:
        status = asyncio.run(probe())
    except LlamaClientError as exc:
        raise EngineError(f"$.server.url: {url} does not answer: {exc}") from None
    if status >= 400:
        raise EngineError(
            f"$.server.url: {url}/health answered HTTP {status}; the server is not ready"
        )
