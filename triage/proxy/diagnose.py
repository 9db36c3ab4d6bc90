"""`--auto-diagnose`: a newly opened incident starts `triage diagnose` against the stack
given with `--stack`, in a child process (the proxy keeps serving).

Never against the production upstream unless asked: a stack whose `[server].url` is the
proxy's upstream is refused at startup without `--diagnose-upstream` (its replays would
add load to the server the proxy protects).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from triage.proxy.record import OpenedIncident

log = logging.getLogger("triage.proxy")
DIAGNOSE_TIMEOUT_SECONDS = 3600


class AutoDiagnoseError(ValueError):
    """The auto-diagnose setup is refused; the message says why."""


def _endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host in ("localhost", "::1", "0.0.0.0"):
        host = "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return host, port


def check_stack(stack_path: Path, upstream: str, *, allow_upstream: bool) -> None:
    """Refuse a stack that replays against the production upstream (unless allowed)."""
    try:
        data = tomllib.loads(stack_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AutoDiagnoseError(f"{stack_path}: cannot read the stack file ({exc})") from None
    server = data.get("server")
    url = server.get("url") if isinstance(server, dict) else None
    if isinstance(url, str) and _endpoint(url) == _endpoint(upstream) and not allow_upstream:
        raise AutoDiagnoseError(
            f"{stack_path}: [server].url {url} is the proxy's upstream; auto-diagnose would "
            "replay against production (pass --diagnose-upstream to allow it)"
        )


class AutoDiagnose:
    """Called by the recorder with each incident it opened."""

    def __init__(
        self,
        stack_path: Path,
        work_dir: Path,
        *,
        database_url: str | None,
        command: list[str] | None = None,
    ) -> None:
        self.stack_path = stack_path
        self.work_dir = work_dir
        self.database_url = database_url
        self.command = command or [sys.executable, "-m", "triage.cli"]
        self.started: list[subprocess.Popen[bytes]] = []

    def __call__(self, incident: OpenedIncident) -> None:
        example = incident.get("example") or {}
        exchange = example.get("exchange") or {}
        request = exchange.get("request")
        if not isinstance(request, dict):
            log.warning("incident %s: no readable request to diagnose", incident["slug"])
            return
        folder = self.work_dir / incident["slug"]
        folder.mkdir(parents=True, exist_ok=True)
        request_file = folder / "request.json"
        response_file = folder / "response.json"
        request_file.write_text(json.dumps(request), encoding="utf-8")
        response = exchange.get("response") or {"error": exchange.get("error")}
        response_file.write_text(json.dumps(response), encoding="utf-8")
        argv = [*self.command]
        if self.database_url:
            argv += ["--database", self.database_url]
        argv += [
            "diagnose",
            "--request",
            str(request_file),
            "--response",
            str(response_file),
            "--stack",
            str(self.stack_path),
            "--incident",
            incident["slug"],
            "--json",
            str(folder / "diagnosis.json"),
        ]
        log_file = (folder / "diagnose.log").open("wb")
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        self.started.append(process)
        threading.Thread(target=self._reap, args=(process,), daemon=True).start()

    @staticmethod
    def _reap(process: subprocess.Popen[bytes]) -> None:
        try:
            process.wait(DIAGNOSE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stop diagnoses still running (their engine stops the servers it started)."""
        for process in self.started:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
