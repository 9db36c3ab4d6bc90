"""The recorder's local spool: batches the database could not take, as JSONL lines.

Each line is one prepared exchange (already redacted, with its idempotency key). The spool
is bounded in bytes; it is replayed batch by batch (never the whole file in memory) once the
database answers, and emptied only after every batch was written, so a crash in between
replays keys that are already stored -- which the unique key turns into no-ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from triage.proxy.metrics import ProxyMetrics
from triage.proxy.prepare import Prepared

log = logging.getLogger("triage.proxy")


def spooled_count(spool_path: Path) -> int:
    """Exchanges waiting in a spool file (read under the spool's lock)."""
    if not spool_path.exists():
        return 0
    with FileLock(str(spool_path) + ".lock"):
        with spool_path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())


class Spool:
    """One spool file, its lock and its bound."""

    def __init__(self, path: Path, *, max_bytes: int, metrics: ProxyMetrics) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.lock = FileLock(str(self.path) + ".lock")

    def pending(self) -> bool:
        """Whether anything waits in the spool."""
        return self.path.exists() and self.path.stat().st_size > 0

    def count(self) -> int:
        return spooled_count(self.path)

    def append(self, prepared: list[Prepared]) -> None:
        """Add the batch; what would pass the bound is counted as dropped, not written."""
        if not prepared:
            return
        written = dropped = 0
        with self.lock:
            size = self.path.stat().st_size if self.path.exists() else 0
            with self.path.open("a", encoding="utf-8") as handle:
                for item in prepared:
                    line = item.to_line()
                    if size + len(line) > self.max_bytes:
                        dropped += 1
                        continue
                    handle.write(line)
                    size += len(line)
                    written += 1
                handle.flush()
        self.metrics.spooled.inc(written)
        if dropped:
            log.error("spool %s is full: %d exchange(s) not recorded", self.path, dropped)
            self.metrics.recording_dropped.inc(dropped)

    def replay(self, write: Callable[[list[Prepared]], None], batch_size: int) -> None:
        """Write the spooled exchanges with `write`, `batch_size` at a time, then empty the
        spool. An error from `write` propagates and keeps the spool as it is."""
        if not self.pending():
            return
        with self.lock:
            unreadable: list[str] = []
            with self.path.open(encoding="utf-8") as handle:
                batch: list[Prepared] = []
                for line in handle:
                    if not line.strip():
                        continue
                    try:
                        batch.append(Prepared.from_line(line))
                    except (ValueError, KeyError, TypeError):
                        unreadable.append(line)  # a line cut by a crash mid-write
                    if len(batch) >= batch_size:
                        write(batch)
                        batch = []
                if batch:
                    write(batch)
            if unreadable:
                # Kept aside, never silently: once, when the spool they came from is emptied.
                log.error(
                    "spool %s: %d unreadable line(s) moved to %s.bad",
                    self.path,
                    len(unreadable),
                    self.path,
                )
                with open(str(self.path) + ".bad", "a", encoding="utf-8") as bad:
                    bad.writelines(unreadable)
            # Only now: a crash before this line replays keys that are already stored,
            # which the unique key turns into no-ops.
            self.path.write_text("", encoding="utf-8")
