"""The recording half of the proxy: a bounded queue and one background writer thread.

The hot path only calls `Recorder.submit(record)` (a non-blocking `put_nowait`; a full queue
drops the record and counts it in `/metrics`). The writer takes records in batches,
prepares each one (`triage.proxy.prepare`: redacted, classified, compressed; successes kept
with probability `sample_successes`, failures always) and writes the batch through the
knowledge-base service in one transaction (`kb.service.live.record_live`), where the
problem writer (`triage.proxy.problems`) may open an incident.

Database unavailable: the batch goes to a local JSONL spool (`triage.proxy.spool`: already
redacted, each line with its idempotency key) and the proxy keeps forwarding. The spool is
replayed before the next batch once the database answers; replayed keys already stored are
skipped, so a crash between a replay's commit and the spool's truncation stores nothing twice.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

from kb.repo.store import Store
from kb.service import DatabaseError, KnowledgeBase
from kb.service.live import record_live
from triage.proxy.grouping import OpeningRules
from triage.proxy.metrics import ProxyMetrics
from triage.proxy.prepare import Prepared, prepare
from triage.proxy.problems import ProblemRules, ProblemWriter
from triage.proxy.record import ExchangeRecord, OpenedIncident, record_size
from triage.proxy.spool import Spool, spooled_count

__all__ = [
    "CURRENT_WINDOW",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_SPOOL_BYTES",
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_QUEUE_SIZE",
    "TRAILING_WINDOW",
    "Prepared",
    "OpenedIncidents",
    "Recorder",
    "RecorderOptions",
    "prepare",
    "spooled_count",
]

log = logging.getLogger("triage.proxy")

DEFAULT_QUEUE_SIZE = 10_000
# Queued records hold their bodies in memory: the queue is bounded in bytes too.
DEFAULT_QUEUE_BYTES = 256 * 1024 * 1024
DEFAULT_BATCH_SIZE = 256
CURRENT_WINDOW = timedelta(minutes=10)
TRAILING_WINDOW = timedelta(hours=1)
# The spool is bounded: past this size (a database down for a long time), further exchanges
# are counted in triage_proxy_recording_dropped_total instead of filling the disk.
DEFAULT_MAX_SPOOL_BYTES = 1024 * 1024 * 1024
_STOP = object()


class RecorderOptions(TypedDict):
    """`Recorder`'s keyword arguments that the recorder process hands its child's Recorder
    (picklable: they cross the spawn pipe)."""

    spool_path: Path
    sample_successes: float
    replica: str
    batch_size: int
    flush_seconds: float
    retry_seconds: float
    current_window: timedelta
    trailing_window: timedelta
    store_factory: Callable[[str | None], Store]
    rng: random.Random | None
    max_spool_bytes: int
    opening: OpeningRules | None


class OpenedIncidents:
    """The incidents a recorder opened (`items`, in order), each handed to the `on_incident`
    hook (auto-diagnose) as it comes; a failing hook is logged, never stops recording."""

    def __init__(self, on_incident: Callable[[OpenedIncident], None] | None) -> None:
        self.on_incident = on_incident
        self.items: list[OpenedIncident] = []

    def add(self, incident: OpenedIncident) -> None:
        self.items.append(incident)
        if self.on_incident is not None:
            try:
                self.on_incident(incident)
            except Exception:  # noqa: BLE001 -- a failing hook must not stop recording
                log.exception("auto-diagnose hook failed for %s", incident["slug"])


def _reason(exc: BaseException) -> str:
    """The name of what failed: the driver's error behind a DatabaseError."""
    return type(exc.__cause__ or exc).__name__


class Recorder:
    """Queue + writer thread; see the module docstring."""

    def __init__(
        self,
        database_url: str | None,
        *,
        spool_path: Path,
        sample_successes: float = 1.0,
        replica: str = "proxy",
        metrics: ProxyMetrics | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_seconds: float = 0.2,
        retry_seconds: float = 2.0,
        current_window: timedelta = CURRENT_WINDOW,
        trailing_window: timedelta = TRAILING_WINDOW,
        on_incident: Callable[[OpenedIncident], None] | None = None,
        store_factory: Callable[[str | None], Store] = Store,
        rng: random.Random | None = None,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
        opening: OpeningRules | None = None,
    ) -> None:
        if not 0.0 <= sample_successes <= 1.0:
            raise ValueError("--sample-successes must be between 0 and 1")
        self.database_url = database_url
        self.spool_path = Path(spool_path)
        self.sample_successes = sample_successes
        self.replica = replica
        self.metrics = metrics or ProxyMetrics()
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.retry_seconds = retry_seconds
        self.incidents = OpenedIncidents(on_incident)
        self.opened = self.incidents.items
        self._store_factory = store_factory
        self._rng = rng or random.Random()
        self.problems = ProblemWriter(
            ProblemRules(opening or OpeningRules(), current_window, trailing_window, replica)
        )
        self.spool = Spool(self.spool_path, max_bytes=max_spool_bytes, metrics=self.metrics)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.queue_bytes = queue_bytes
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._kb: KnowledgeBase | None = None
        self.written = 0
        self.submitted = 0
        # Records taken off the queue and finished (stored, spooled, or dropped as
        # unreadable), in submission order: the journal deletes what is below this count.
        self.completed = 0

    # ------------------------------------------------------------------ hot path

    def submit(self, record: ExchangeRecord) -> bool:
        """Queue a raw record without blocking; False when the queue is full (dropped)."""
        size = record_size(record)
        with self._bytes_lock:
            if self._queued_bytes + size > self.queue_bytes:
                return False
            self._queued_bytes += size
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._bytes_lock:
                self._queued_bytes -= size
            return False
        self.submitted += 1
        return True

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> bool:
        """Create the spool's folder and open (migrate) the store; False when the database
        is unavailable now (the writer retries it and spools meanwhile)."""
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        # Migrate here, before serving: Alembic is not safe to run from two threads of one
        # process at once. A database that is down now is retried by the writer.
        try:
            self._open_store()
        except (DatabaseError, OSError) as exc:
            log.warning("database unavailable at start (%s): spooling", _reason(exc))
            self._kb = None
            return False
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self.open()
        self._thread = threading.Thread(target=self._run, name="triage-proxy-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Write what is queued (or spool it) and stop the writer."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        if self._kb is not None:
            self._kb.close()
            self._kb = None

    def flush(self, expected: int = 0, timeout: float = 30.0) -> None:
        """Block until every record queued so far has been written or spooled; with
        `expected`, first until that many records were submitted (the proxy hands a record
        over just after the client has its last byte)."""
        deadline = time.monotonic() + timeout
        while self.submitted < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        self._queue.join()

    # ------------------------------------------------------------------ writer

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[ExchangeRecord] = []
            try:
                item = self._queue.get(timeout=self.retry_seconds)
            except queue.Empty:
                self._replay_if_due()
                continue
            taken = 1
            if item is _STOP:
                stopping = True
            else:
                batch.append(item)
            while not stopping and len(batch) < self.batch_size:
                try:
                    item = self._queue.get(timeout=self.flush_seconds if batch else 0)
                except queue.Empty:
                    break
                taken += 1
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
            try:
                self._process(batch)
            except Exception:  # noqa: BLE001 -- the writer must outlive any one bad batch
                log.exception("recording a batch of %d exchanges failed", len(batch))
            finally:
                self.completed += len(batch)
                for _ in range(taken):
                    self._queue.task_done()

    def _process(self, batch: list[ExchangeRecord]) -> None:
        prepared = []
        with self._bytes_lock:
            self._queued_bytes -= sum(record_size(record) for record in batch)
        for record in batch:
            keep = self.sample_successes >= 1.0 or self._rng.random() < self.sample_successes
            try:
                item = prepare(record, keep_success=keep, replica=self.replica)
            except Exception:  # noqa: BLE001 -- one unreadable record must not lose the batch
                log.exception("cannot classify exchange %s", record.get("key"))
                continue
            self.metrics.observe_exchange(item.row["model"], item.row["signature"], item.usage)
            prepared.append(item)
        if not self._replay_spool():
            self._spool(prepared)
            return
        if prepared and not self._write_or_spool(prepared):
            return

    def _write_or_spool(self, prepared: list[Prepared]) -> bool:
        try:
            self._write(prepared)
        except (DatabaseError, OSError) as exc:
            log.warning("database unavailable (%s): spooling %d", _reason(exc), len(prepared))
            self._drop_store()
            self._spool(prepared)
            return False
        return True

    def _drop_store(self) -> None:
        if self._kb is not None:
            try:
                self._kb.close()
            except Exception:  # noqa: BLE001 -- closing a broken engine
                pass
            self._kb = None

    def _open_store(self) -> KnowledgeBase:
        if self._kb is None:
            self._kb = KnowledgeBase.opened_by(self._store_factory, self.database_url)
        return self._kb

    # ------------------------------------------------------------------ spool

    def _spool(self, prepared: list[Prepared]) -> None:
        self.spool.append(prepared)

    def spooled_count(self) -> int:
        return self.spool.count()

    def _replay_if_due(self) -> None:
        if self.spool.pending():
            self._replay_spool()

    def _replay_spool(self) -> bool:
        """Write the spooled exchanges (batch by batch, never the whole file in memory);
        True when the spool is empty afterwards."""
        try:
            self.spool.replay(self._write, self.batch_size)
        except (DatabaseError, OSError) as exc:
            log.info("database still unavailable (%s); spool kept", _reason(exc))
            self._drop_store()
            return False
        return True

    # ------------------------------------------------------------------ store

    def _write(self, prepared: list[Prepared]) -> None:
        kb = self._open_store()
        opened = record_live(kb, lambda batch: self.problems.write(batch, prepared))
        self.written += len(prepared)
        for incident in opened:
            self.metrics.incidents.labels(incident["model"], incident["signature"]).inc()
            self.incidents.add(incident)
