"""The recorder process's own side (see triage.proxy.recorder_process): its entry point, the
Recorder that reports each batch to the parent, the metrics relay and the CPU priority."""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Mapping
from typing import Any, Unpack, cast

from kb.repo.engine import redact_url
from triage.capture import redact_text
from triage.proxy import recorder as _recorder
from triage.proxy.metrics import ProxyMetrics, token_count
from triage.proxy.record import ExchangeRecord, OpenedIncident, record_size
from triage.proxy.recorder import Recorder, RecorderOptions

__all__ = ["child_main", "lower_priority", "replay_metric_update", "restore_priority"]

log = logging.getLogger("triage.proxy")

# Metric methods the child may have the parent call (see _MetricsRelay).
_RELAYED = frozenset({"inc", "observe", "observe_exchange"})


class _MetricRelay:
    """One metric (or labelled child of one) in the child: each update becomes a call the
    parent replays on its own registry."""

    def __init__(self, calls: list[tuple[Any, ...]], attr: str, labels: tuple[str, ...] = ()):
        self._calls, self._attr, self._labels = calls, attr, labels

    def labels(self, *values: Any) -> _MetricRelay:
        return _MetricRelay(self._calls, self._attr, tuple(str(v) for v in values))

    def inc(self, amount: float = 1.0) -> None:
        self._calls.append((self._attr, self._labels, "inc", (amount,)))

    def observe(self, value: float) -> None:
        self._calls.append((self._attr, self._labels, "observe", (value,)))


class _MetricsRelay:
    """Stands in for ProxyMetrics in the child: records what the Recorder updates."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def observe_exchange(self, model: str, signature: str, usage: Mapping[str, int]) -> None:
        self.calls.append(("", (), "observe_exchange", (model, signature, dict(usage))))

    def __getattr__(self, name: str) -> _MetricRelay:
        if name.startswith("_"):
            raise AttributeError(name)
        return _MetricRelay(self.calls, name)

    def take(self) -> list[tuple[Any, ...]]:
        """The updates since the last take, summed: one `inc` per metric and label set and one
        `observe_exchange` per model and signature (with the count and the summed token
        numbers) instead of one call per exchange. The parent applies them on a thread that
        shares the interpreter lock with the event loop: a batch of 256 exchanges is a
        handful of updates there, not a thousand."""
        incs: dict[tuple[str, tuple[str, ...]], float] = {}
        exchanges: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
        others: list[tuple[Any, ...]] = []
        for attr, labels, method, args in self.calls:
            if method == "inc":
                incs[(attr, labels)] = incs.get((attr, labels), 0.0) + args[0]
            elif method == "observe_exchange":
                model, signature, usage = args[:3]
                count, sums = exchanges.get((model, signature), (0, {}))
                for key, value in usage.items():
                    if tokens := token_count(value):
                        sums[key] = sums.get(key, 0) + tokens
                exchanges[(model, signature)] = (count + 1, sums)
            else:
                others.append((attr, labels, method, args))
        self.calls.clear()
        summed: list[tuple[Any, ...]] = [
            (attr, labels, "inc", (amount,)) for (attr, labels), amount in incs.items()
        ]
        summed += [
            ("", (), "observe_exchange", (model, signature, sums, count))
            for (model, signature), (count, sums) in exchanges.items()
        ]
        return summed + others


def lower_priority() -> str:
    """Put every thread of this process in SCHED_IDLE (Linux), else nice 19; returns which.
    (sched_setscheduler(0, ...) changes the calling thread only, hence every task.)"""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            tasks = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            tasks = [0]
        try:
            for task in tasks:
                os.sched_setscheduler(task, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except OSError:
            pass
    try:
        os.nice(19)
        return "nice 19"
    except OSError:
        return "normal"


def restore_priority(pid: int | str = "self") -> bool:
    """Every thread of process `pid` back to normal scheduling, for the final drain (best
    effort: it needs the right to raise a priority; nice cannot be undone). True if done."""
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_OTHER")):
        return False
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return False
    return True


class _Inbox(queue.Queue[Any]):
    """The child Recorder's queue: records from the parent's multiprocessing queue. The
    parent's stop sentinel (None), a closed pipe or a vanished parent read as the Recorder's
    own stop marker."""

    def __init__(self, source: Any) -> None:
        super().__init__()
        self._source = source
        self._parent = multiprocessing.parent_process()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            item = self._source.get(block, timeout)
        except queue.Empty:
            if self._parent is not None and not self._parent.is_alive():
                log.warning("the proxy process is gone: the recorder writes what it has and stops")
                return _recorder._STOP
            raise
        except (EOFError, OSError):
            return _recorder._STOP
        if item is None:
            restore_priority()
            return _recorder._STOP
        return item

    def task_done(self) -> None:
        pass


class _ChildRecorder(Recorder):
    """The Recorder, reporting each batch (and each idle replay) to the parent."""

    def __init__(
        self,
        database_url: str | None,
        *,
        inbox: Any,
        events: Any,
        **options: Unpack[RecorderOptions],
    ):
        self._relay = _MetricsRelay()
        super().__init__(
            database_url,
            metrics=cast(ProxyMetrics, self._relay),
            on_incident=self._incident,
            **options,
        )
        self._queue = _Inbox(inbox)
        self._events = events
        self._reported_written = 0

    def _incident(self, incident: OpenedIncident) -> None:
        self._relay.calls.append(("", (), "incident", (incident,)))

    def _process(self, batch: list[ExchangeRecord]) -> None:
        size = sum(record_size(record) for record in batch)
        try:
            super()._process(batch)
        finally:
            self.report(len(batch), size)

    def _replay_if_due(self) -> None:
        try:
            super()._replay_if_due()
        finally:
            if self._relay.calls or self.written != self._reported_written:
                self.report(0, 0)

    def report(self, done: int, size: int) -> None:
        self._reported_written = self.written
        message = ("batch", done, size, self.written, time.process_time(), self._relay.take())
        self._events.put(message)


class _LogRelay(logging.handlers.QueueHandler):
    """The child's log records, formatted, to the parent's loggers."""

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(("log", record))


def child_main(
    database_url: str | None,
    options: RecorderOptions,
    records: Any,
    events: Any,
    log_level: int,
    idle: bool,
) -> None:
    """Entry point of the recorder process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = logging.getLogger()
    root.handlers[:] = [_LogRelay(events)]
    root.setLevel(log_level)
    try:
        recorder = _ChildRecorder(database_url, inbox=records, events=events, **options)
        database_up = recorder.open()
    except Exception as exc:  # noqa: BLE001 -- reported to the parent as one line
        message = redact_text(redact_url(f"{type(exc).__name__}: {exc}"))[:500]
        events.put(("failed", message))
        events.close()
        events.join_thread()
        raise SystemExit(1) from None
    priority = lower_priority() if idle else "normal"
    events.put(("ready", database_up, priority, time.process_time()))
    try:
        recorder._run()
    finally:
        recorder._drop_store()
        events.put(("stopped", recorder.written, time.process_time()))
        events.close()
        parent = multiprocessing.parent_process()
        if parent is not None and not parent.is_alive():
            # Nobody reads the pipe any more (this process holds its read end too): do not
            # wait for the feeder to push into it.
            events.cancel_join_thread()
        else:
            events.join_thread()


def replay_metric_update(
    metrics: ProxyMetrics, attr: str, labels: tuple[str, ...], method: str, args: tuple[Any, ...]
) -> None:
    """Apply, in the parent, one metric update `_MetricsRelay.take` returned in the child."""
    if method not in _RELAYED:
        raise ValueError(f"not a metric update: {method}")
    target: Any = getattr(metrics, attr) if attr else metrics
    if labels:
        target = target.labels(*labels)
    getattr(target, method)(*args)
