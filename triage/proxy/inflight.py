"""The recorder process's ledger of records in flight (triage.proxy.recorder_process): what
the proxy handed to the child and the child has not acknowledged yet.

A record is admitted against two bounds (records and bytes in flight, like `Recorder`'s
queue); each batch the child acknowledges frees its records and bytes; a child that dies
takes the rest with it (counted as lost); `flush` waits until what was submitted is
acknowledged. One condition guards it all: the event loop admits, the back-channel reader
acknowledges, the caller of `flush` waits.
"""

from __future__ import annotations

import threading

__all__ = ["InFlight"]


class InFlight:
    """Counts of the records between `submit` and the child's acknowledgement."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._changed = threading.Condition(threading.Lock())
        self.submitted = 0
        self.acknowledged = 0  # finished by the child, or lost with it
        # Records the child finished (stored, spooled or dropped as unreadable), in
        # submission order; unlike the acknowledgements, never those lost with the child
        # (the journal keeps those for the next start).
        self.completed = 0
        self.lost = 0  # admitted, then lost with a child that died
        self.bytes = 0
        self.closed = False  # no child to take more: nothing is admitted, nobody waits

    def admit(self, size: int) -> bool:
        """Count a record of `size` bytes in; False when a bound (or a closed ledger) refuses
        it."""
        with self._changed:
            in_flight = self.submitted - self.acknowledged
            if self.closed or in_flight >= self.max_records or self.bytes + size > self.max_bytes:
                return False
            self.bytes += size
            self.submitted += 1
        return True

    def withdraw(self, size: int) -> None:
        """Take back an admitted record that never reached the child's queue."""
        with self._changed:
            self.bytes -= size
            self.submitted -= 1

    def acknowledge(self, done: int, size: int) -> None:
        """The child finished `done` records holding `size` bytes."""
        with self._changed:
            self.acknowledged += done
            self.completed += done
            self.bytes -= size
            self._changed.notify_all()

    def close(self) -> None:
        """No child any more: admit nothing, wake whoever waits."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def lose_the_rest(self) -> int:
        """The child exited: what was admitted and not acknowledged is lost; how many."""
        with self._changed:
            lost = self.submitted - self.acknowledged
            self.lost += lost
            self.acknowledged += lost
            self.bytes = 0
            self.closed = True
            self._changed.notify_all()
        return lost

    def wait(self, timeout: float) -> int:
        """Wait until every record submitted so far is acknowledged (or the ledger is
        closed); 0 then, else how many were still outstanding after `timeout` seconds."""
        with self._changed:
            target = self.submitted
            done = self._changed.wait_for(
                lambda: self.acknowledged >= target or self.closed, timeout
            )
            return 0 if done else target - self.acknowledged
