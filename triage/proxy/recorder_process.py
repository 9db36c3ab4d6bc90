"""The proxy's recorder in a process of its own, at the lowest CPU priority.

`RecorderProcess` is a drop-in for `triage.proxy.recorder.Recorder` as `ProxyApp` sees it
(`start`, `submit`, `stop`, `flush`, `written`, `submitted`, `opened`, `spooled_count`). It
runs the very same `Recorder` logic (redaction, classification, batches, spool and replay,
change detection, family matching) in a child process started with the "spawn" context, so
none of that work holds the proxy's interpreter lock: with the writer as a thread, its ~1 ms
of CPU per exchange and its GIL slices delayed the event loop (64 streaming clients on two
cores: +67 ms p50 / +123 ms p99 added; the proxy without a recorder added ~0).

Priority: once its store is open, the child puts every one of its threads in the
`SCHED_IDLE` scheduling class (Linux), else `nice 19`. SCHED_IDLE, not nice 19: a nice-19
task still gets a CFS slice (weight 15 against 1024) and its wakeups preempt the event loop's
thread, so on a busy host it still delays forwarding; a SCHED_IDLE task runs only when no
normal task wants the CPU. The price is explicit: on a host that is busy all the time the
child falls behind, the bounded queue fills and further exchanges are dropped and counted
(`triage_proxy_recording_dropped_total`) -- the forwarding itself is never slowed down. The
child's start-up (imports, migrations) runs at normal priority: the proxy does not serve
yet, and SCHED_IDLE would let a loaded host stall the start for minutes. At `stop()` the
parent puts the child back to normal priority (best effort: it needs the right to raise a
priority) so it writes what is left quickly: the proxy has stopped serving by then.

Hot path: `submit(record)` checks the bounds (records and bytes in flight, exactly like
`Recorder`), and `put_nowait`s the record on a `multiprocessing.Queue`: an append to a deque;
pickling and the pipe write happen in the queue's feeder thread, never on the event loop.

Back channel: the child sends, per batch, one message with the metric updates its
`Recorder` made (exchanges by model and signature, tokens, spooled, dropped, incidents
opened), the incidents it opened, its log records and its acknowledgement (records done,
bytes freed, rows written, CPU used). A daemon thread of the parent applies them to the
parent's `ProxyMetrics` (the child cannot touch the parent's Prometheus registry) and calls
`on_incident` -- auto-diagnose stays in the parent, never in the SCHED_IDLE child.

Faults: a child that dies at start is a clear `RecorderProcessError`; one that dies mid-run
is noticed by the parent (a warning, once; the exchanges it had not finished are counted as
dropped; `submit` then returns False and the proxy keeps forwarding). The spool and its lock
are the child's: a new process on the same spool replays it, and the idempotency keys store
nothing twice. The database URL reaches the child in the spawn pipe (never on a command
line) and is never logged. The child ignores SIGINT (a Ctrl-C in the terminal reaches the
whole process group; the parent stops it with the sentinel) and stops by itself, writing
what it has, when the parent process is gone. Besides the child, multiprocessing runs its
resource tracker (a helper that exits with the proxy).

Embedding: as with any "spawn" child, the program that starts a RecorderProcess must guard
its main module (`if __name__ == "__main__":`); `triage proxy` and `python -m triage.cli` do.
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import queue
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from kb.repo.store import Store
from triage.proxy.grouping import OpeningRules
from triage.proxy.inflight import InFlight
from triage.proxy.metrics import ProxyMetrics
from triage.proxy.record import ExchangeRecord, OpenedIncident, record_size
from triage.proxy.recorder import (
    CURRENT_WINDOW,
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_SPOOL_BYTES,
    DEFAULT_QUEUE_BYTES,
    DEFAULT_QUEUE_SIZE,
    TRAILING_WINDOW,
    OpenedIncidents,
    RecorderOptions,
    spooled_count,
)
from triage.proxy.recorder_child import child_main, replay_metric_update, restore_priority

log = logging.getLogger("triage.proxy")

READY_TIMEOUT_SECONDS = 60.0
# How long flush() waits for the child to finish what was queued (a SCHED_IDLE child on a
# busy host can be slow; a stuck one must not hang the caller forever).
FLUSH_DRAIN_SECONDS = 600.0
_POLL_SECONDS = 0.25


class RecorderProcessError(RuntimeError):
    """The recorder process could not start; the message says why."""


class RecorderProcess:
    """Recorder in a child process; see the module docstring. Arguments as `Recorder`'s
    (`store_factory` and `rng` must be picklable), plus `ready_timeout` (seconds to wait for
    the child's store at start) and `idle` (False keeps the child at normal priority)."""

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
        ready_timeout: float = READY_TIMEOUT_SECONDS,
        idle: bool = True,
        opening: OpeningRules | None = None,
    ) -> None:
        if not 0.0 <= sample_successes <= 1.0:
            raise ValueError("--sample-successes must be between 0 and 1")
        self.database_url = database_url
        self.spool_path = Path(spool_path)
        self.replica = replica
        self.metrics = metrics or ProxyMetrics()
        self.incidents = OpenedIncidents(on_incident)  # applied here, never in the child
        self.opened = self.incidents.items
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.ready_timeout = ready_timeout
        self.idle = idle
        self._options: RecorderOptions = {
            "spool_path": self.spool_path,
            "sample_successes": sample_successes,
            "replica": replica,
            "batch_size": batch_size,
            "flush_seconds": flush_seconds,
            "retry_seconds": retry_seconds,
            "current_window": current_window,
            "trailing_window": trailing_window,
            "store_factory": store_factory,
            "rng": rng,
            "max_spool_bytes": max_spool_bytes,
            "opening": opening,
        }
        self._context = multiprocessing.get_context("spawn")
        self._records: Any = self._context.Queue()
        self._events: Any = self._context.Queue()
        self._flight = InFlight(queue_size, queue_bytes)
        self._process: BaseProcess | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self.written = 0
        self.child_cpu_seconds = 0.0  # CPU the child used (all its threads), start-up included
        self.startup_cpu_seconds = 0.0  # of which before it was ready (imports, migrations)
        self.database_up_at_start: bool | None = None
        self.priority = ""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def submitted(self) -> int:
        return self._flight.submitted

    @property
    def completed(self) -> int:
        """Records the child finished, in submission order (see InFlight.completed)."""
        return self._flight.completed

    @property
    def lost(self) -> int:
        return self._flight.lost

    # ------------------------------------------------------------------ hot path

    def submit(self, record: ExchangeRecord) -> bool:
        """Queue a raw record without blocking; False when the queue is full or the recorder
        process is gone (dropped)."""
        size = record_size(record)
        if self._stopping or not self._flight.admit(size):
            return False
        try:
            self._records.put_nowait(record)  # pickled by the queue's feeder thread
        except (ValueError, OSError):  # closed under us (stop racing a late request)
            self._flight.withdraw(size)
            return False
        return True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Spawn the child and wait until its store is open (or it spools); a child that
        cannot start raises RecorderProcessError naming why."""
        if self._process is not None:
            return
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        level = logging.getLogger("triage.proxy").getEffectiveLevel()
        process = self._context.Process(
            target=child_main,
            args=(self.database_url, self._options, self._records, self._events, level, self.idle),
            name="triage-recorder",
            daemon=True,  # never outlives the proxy, also when it is interrupted
        )
        self._process = process
        process.start()
        try:
            self._wait_ready(process)
        except BaseException:
            self._flight.close()
            self._end(process, 5.0)
            raise
        self._reader = threading.Thread(
            target=self._read_events, name="triage-recorder-events", daemon=True
        )
        self._reader.start()

    def _wait_ready(self, process: BaseProcess) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                message = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not process.is_alive():
                    raise RecorderProcessError(
                        f"the recorder process exited (status {process.exitcode}) before it "
                        "was ready"
                    ) from None
                if time.monotonic() > deadline:
                    raise RecorderProcessError(
                        f"the recorder process was not ready within {self.ready_timeout:.0f} s"
                    ) from None
                continue
            if message[0] == "ready":
                _, self.database_up_at_start, self.priority, self.startup_cpu_seconds = message
                log.info("recorder process %s started (%s)", process.pid, self.priority)
                return
            if message[0] == "failed":
                raise RecorderProcessError(f"the recorder process could not start: {message[1]}")
            self._handle(message)

    def stop(self, timeout: float = 30.0) -> None:
        """Have the child write (or spool) everything queued and exit; a child still running
        after `timeout` s is terminated, then killed: no process is left behind."""
        process = self._process
        if self._stopping:
            return
        self._stopping = True
        if process is None:  # never started: what was submitted is not recorded
            self._records.cancel_join_thread()
            self._records.close()
            return
        if process.is_alive():
            # The proxy no longer serves: the child drains at normal priority (at SCHED_IDLE
            # on a busy host it could not reach the sentinel before the timeout).
            if self.idle and process.pid is not None:
                restore_priority(process.pid)
            try:
                self._records.put(None)
            except (ValueError, OSError):
                pass
        process.join(timeout)
        if process.is_alive():
            log.warning("the recorder process did not stop within %.0f s: ending it", timeout)
        self._end(process, 5.0)
        if self._reader is not None:
            self._reader.join(10.0)
        self._flight.close()

    def _end(self, process: BaseProcess, grace: float) -> None:
        """Terminate, then kill, a child that is still running; release the queues."""
        if process.is_alive():
            process.terminate()
            process.join(grace)
        if process.is_alive():
            process.kill()
            process.join(grace)
        # Records the child will never read: do not wait for the feeder to push them into a
        # pipe nobody drains.
        self._records.cancel_join_thread()
        self._records.close()

    def flush(self, expected: int = 0, timeout: float = 30.0) -> None:
        """Block until every record queued so far has been written or spooled by the child
        (or the child is gone); with `expected`, first until that many records were
        submitted (the proxy hands a record over just after the client has its last byte)."""
        deadline = time.monotonic() + timeout
        flight = self._flight
        while flight.submitted < expected and time.monotonic() < deadline and not flight.closed:
            time.sleep(0.01)
        if self._process is None:
            return
        outstanding = flight.wait(FLUSH_DRAIN_SECONDS)
        if outstanding:
            log.warning("recorder process: %d exchange(s) still queued", outstanding)

    def spooled_count(self) -> int:
        return spooled_count(self.spool_path)

    # ------------------------------------------------------------------ back channel

    def _read_events(self) -> None:
        process = self._process
        assert process is not None
        while True:
            try:
                message = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if process.is_alive():
                    continue
                self._child_gone(process)
                return
            except (EOFError, OSError):
                self._child_gone(process)
                return
            if message[0] == "stopped":
                self.written, self.child_cpu_seconds = message[1], message[2]
                self._child_gone(process)
                return
            try:
                self._handle(message)
            except Exception:  # noqa: BLE001 -- the reader must outlive one bad message
                log.exception("recorder process: cannot apply %s", message[0])

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "log":
            record: logging.LogRecord = message[1]
            logging.getLogger(record.name).handle(record)
        elif kind == "batch":
            _, done, size, written, cpu, calls = message
            for call in calls:
                self._apply(*call)
            # Before the acknowledgement: a flush it wakes reads them.
            self.written, self.child_cpu_seconds = written, cpu
            self._flight.acknowledge(done, size)

    def _apply(
        self, attr: str, labels: tuple[str, ...], method: str, args: tuple[Any, ...]
    ) -> None:
        """Replay one metric update (or an opened incident) of the child in this process."""
        if method == "incident":
            self.incidents.add(args[0])
            return
        replay_metric_update(self.metrics, attr, labels, method, args)

    def _child_gone(self, process: BaseProcess) -> None:
        """The child exited: what it had accepted and not finished is lost (counted)."""
        process.join(5.0)
        lost = self._flight.lose_the_rest()
        if lost:
            self.metrics.recording_dropped.inc(lost)
        if not self._stopping or process.exitcode not in (0, None):
            log.warning(
                "the recorder process exited (status %s): %d queued exchange(s) not recorded; "
                "the proxy keeps forwarding without recording",
                process.exitcode,
                lost,
            )
