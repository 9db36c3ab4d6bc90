"""A server's log file: its output copied there, bounded, and the file's last lines."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

__all__ = ["LogPump", "read_tail"]


class LogPump:
    """Copies a server's output into its log file, at most `limit` bytes; past that it keeps
    only the last `keep` bytes in memory and appends them, after a marker line, at the end."""

    def __init__(self, source: io.BufferedReader, path: Path, limit: int, keep: int) -> None:
        self.path = path
        self._source = source
        self._limit = limit
        self._keep = keep
        self._written = 0
        self._ring = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"log {path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._source, self.path.open("ab") as out:
            while chunk := self._source.read1(65536):
                room = self._limit - self._written
                if room > 0:
                    out.write(chunk[:room])
                    out.flush()
                    self._written += min(room, len(chunk))
                    chunk = chunk[room:]
                if chunk:
                    with self._lock:
                        self._ring += chunk
                        excess = len(self._ring) - self._keep
                        if excess > 0:
                            self._dropped += excess
                            del self._ring[:excess]
            with self._lock:
                if self._ring:
                    out.write(self._marker() + bytes(self._ring))
                    self._ring.clear()

    def _marker(self) -> bytes:
        return (
            f"\n# [triage] log limit of {self._limit} bytes reached: {self._dropped} bytes "
            f"dropped, the last {len(self._ring)} bytes follow\n"
        ).encode()

    def pending(self) -> bytes:
        """Output past the limit not yet in the file (the process still runs)."""
        with self._lock:
            return self._marker() + bytes(self._ring) if self._ring else b""

    def join(self, timeout: float) -> None:
        """Wait until the output is in the file (EOF: every writer has exited)."""
        self._thread.join(timeout)


def read_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file (read from its last 64 KiB); "" if unreadable."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])
