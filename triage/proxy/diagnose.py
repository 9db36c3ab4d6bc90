"""`--auto-diagnose`: a newly opened incident is diagnosed against the stack given with
`--stack` -- `triage.engine.diagnose` called in a worker process this hook starts, bounds in
time and stops (the proxy keeps serving).

A worker process, not a thread of the proxy: a diagnosis runs for minutes to an hour,
replays, scores and writes; in the proxy's process it would hold the interpreter lock the
event loop forwarding every chunk needs (see triage.commands.proxy._serve). The worker is
started with the "spawn" context (the proxy is multi-threaded: fork is unsafe), gets the
database URL through the spawn pipe (never on a command line) and calls the engine directly
-- no command line to build or parse. Its servers are stopped by the engine when the run
fails, and by the launcher's SIGTERM handler when the hook stops the worker (a diagnosis
past DIAGNOSE_TIMEOUT_SECONDS, or the proxy stopping).

Never against the production upstream unless asked: a stack whose `[server].url` is the
proxy's upstream is refused at startup without `--diagnose-upstream` (its replays would
add load to the server the proxy protects).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.process
import os
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from urllib.parse import urlsplit

from kb.domain.errors import StoreError
from kb.repo.store import Store
from triage.atlas.report import diagnosis_matches
from triage.capture import CaptureError, load_file
from triage.engine import EngineError, Event, Intake, diagnose
from triage.proxy.record import OpenedIncident
from triage.stackfile import StackError, load_stack

log = logging.getLogger("triage.proxy")
DIAGNOSE_TIMEOUT_SECONDS = 3600
STOP_GRACE_SECONDS = 30  # SIGTERM (the worker's servers are stopped), then SIGKILL
POLL_SECONDS = 1.0  # how soon a reaper sees stop()


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


@dataclass(frozen=True)
class DiagnoseJob:
    """One auto-diagnosis, as the worker process receives it (pickled through the spawn
    pipe): the incident, the stack file, the captured pair written in `folder`."""

    slug: str
    stack_path: Path
    folder: Path
    database_url: str | None

    @property
    def request_file(self) -> Path:
        return self.folder / "request.json"

    @property
    def response_file(self) -> Path:
        return self.folder / "response.json"

    @property
    def log_file(self) -> Path:
        return self.folder / "diagnose.log"

    @property
    def diagnosis_file(self) -> Path:
        return self.folder / "diagnosis.json"


def run_job(job: DiagnoseJob) -> None:
    """The worker process: diagnose the incident's example against the stack, as
    `triage diagnose --request --response --stack --incident --json` would; progress and
    the outcome go to `diagnose.log`, the diagnosis JSON to `diagnosis.json`. Exit status 1
    when the engine refused or failed (named in the log)."""
    # Everything the worker writes goes to the log, as the output of `triage diagnose` did:
    # its own lines and anything a library prints, never the proxy's terminal.
    with job.log_file.open("ab") as sink:
        os.dup2(sink.fileno(), sys.stdout.fileno())
        os.dup2(sink.fileno(), sys.stderr.fileno())
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(message)s", force=True
    )
    worker = logging.getLogger("triage.proxy.diagnose")
    worker.setLevel(logging.INFO)  # its progress lines; libraries' warnings only
    try:
        stack = load_stack(job.stack_path)
        exchanges = load_file(job.request_file, response=job.response_file)
        if not exchanges:
            raise CaptureError(str(job.request_file), None, "no exchange found")
        intake = Intake.of(exchanges[0])
        store = Store(job.database_url)
        try:
            diagnosis = diagnose(store, intake, stack, incident=job.slug, progress=_logged(worker))
        finally:
            store.close()
    except (EngineError, StackError, CaptureError, StoreError) as exc:
        worker.error("diagnosis of %s not run: %s", job.slug, exc)
        sys.exit(1)
    except Exception:  # noqa: BLE001 -- a defect: its traceback in the log, exit status 1
        worker.exception("diagnosis of %s failed", job.slug)
        sys.exit(1)
    data = diagnosis.to_json()
    # The atlas with the verdicts, as `triage diagnose --json` writes it.
    matches, _, _ = diagnosis_matches(stack, intake.exchange, diagnosis.findings, data)
    data = {**data, "atlas_matches": [m.to_dict() for m in matches]}
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    job.diagnosis_file.write_text(text, encoding="utf-8")
    verdict = diagnosis.verdict.headline if diagnosis.verdict else diagnosis.state
    worker.info("diagnosis of %s (run %s): %s", job.slug, diagnosis.run_id, verdict)


def _logged(worker: logging.Logger) -> Callable[[Event], None]:
    def progress(event: Event) -> None:
        worker.info("%-7s %s", event.stage, event.message)

    return progress


class AutoDiagnose:
    """Called by the recorder with each incident it opened. Each worker has one reaper
    thread, the only one that waits for it, signals it and reaps it: it stops the worker
    past `timeout` or when `stop()` is called (SIGTERM, then SIGKILL after a grace)."""

    def __init__(
        self,
        stack_path: Path,
        work_dir: Path,
        *,
        database_url: str | None,
        timeout: float = DIAGNOSE_TIMEOUT_SECONDS,
    ) -> None:
        self.stack_path = stack_path
        self.work_dir = work_dir
        self.database_url = database_url
        self.timeout = timeout
        self.started: list[multiprocessing.process.BaseProcess] = []
        self._reapers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._context = multiprocessing.get_context("spawn")

    def __call__(self, incident: OpenedIncident) -> None:
        if self._stopping.is_set():
            return
        example = incident.get("example") or {}
        exchange = example.get("exchange") or {}
        request = exchange.get("request")
        if not isinstance(request, dict):
            log.warning("incident %s: no readable request to diagnose", incident["slug"])
            return
        job = DiagnoseJob(
            incident["slug"], self.stack_path, self.work_dir / incident["slug"], self.database_url
        )
        job.folder.mkdir(parents=True, exist_ok=True)
        job.request_file.write_text(json.dumps(request), encoding="utf-8")
        response = exchange.get("response") or {"error": exchange.get("error")}
        job.response_file.write_text(json.dumps(response), encoding="utf-8")
        process = self._context.Process(
            target=run_job, args=(job,), name=f"auto-diagnose {job.slug}"
        )
        process.start()
        self.started.append(process)
        reaper = threading.Thread(target=self._reap, args=(process,), daemon=True)
        reaper.start()
        self._reapers.append(reaper)

    def _reap(self, process: multiprocessing.process.BaseProcess) -> None:
        started = time.monotonic()
        while not self._stopping.is_set():
            left = started + self.timeout - time.monotonic()
            if left <= 0:
                log.warning("%s: still running after %.0f s, stopped", process.name, self.timeout)
                break
            if wait([process.sentinel], min(left, POLL_SECONDS)):
                break  # the worker ended
        if process.exitcode is None:
            process.terminate()
            process.join(STOP_GRACE_SECONDS)
            if process.exitcode is None:
                process.kill()
        process.join()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every diagnosis started so far has ended (or `timeout` seconds)."""
        for reaper in list(self._reapers):
            reaper.join(timeout)

    def stop(self) -> None:
        """Stop diagnoses still running (SIGTERM: the launcher stops their servers) and
        start no more."""
        self._stopping.set()
        self.wait(STOP_GRACE_SECONDS + 2 * POLL_SECONDS)
