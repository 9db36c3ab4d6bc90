"""The proxy's journal: every exchange it answered, on local disk before it is forgotten.

Without it, an exchange lives in memory between the client's last byte and the recorder's
commit (the recorder's queue, the recorder process's pipe, a batch being classified): a
SIGKILLed proxy lost up to 80% of what it had answered. `JournaledRecorder` wraps the
recorder (thread or process): `submit(record)` hands the record to the recorder AND appends
it to a pending list (a list append on the event loop: no encoding, no system call there).
A writer thread, every `interval` seconds, encodes the pending records and appends them to
the active segment file (`os.write`: in the page cache, safe from a SIGKILL from then on); a
second thread fsyncs what was written (safe from a power loss from then on) -- apart, so a
slow disk's fsync never holds back the next write.

Segments (`<pid>-<start>-<n>.journal` under the journal folder) are rotated every
`rotate_seconds` or `rotate_bytes`; a closed segment is deleted once the recorder has
finished every record in it (`completed`: written to the store or to its spool). The writer
holds an exclusive `flock` on each of its segments, so several proxies can share a folder:
at start, a segment whose lock can be taken belongs to a proxy that is gone, and its records
are replayed -- submitted again with their idempotency keys (the store keeps one row per key:
what was recorded already is not recorded twice), re-journaled in the new segments, then the
old file is deleted.

Bound (README "Proxy" -> "Durability"): a SIGKILL loses the exchanges completed within the
last `interval` (not yet handed to the OS), a power loss also those written since the last
fsync completed (one fsync's duration, plus the interval). A record cut by a crash mid-write
(a torn tail) fails its length or CRC check: it is skipped with a log line and the rest of
that segment is not trusted; never a crash.

Secrets never reach the journal: headers are redacted like a capture's
(`redact_headers`), bodies with `redact_text` (token-shaped secrets, `"api_key": "..."`,
`Bearer ...`), in the writer thread, before the first byte is written. The recorder redacts
the replayed records again (the markers are stable), so a replayed exchange is stored as it
would have been.

Frame: 4-byte big-endian payload length, 4-byte CRC32 of the payload, the payload (ASCII
JSON: bodies as UTF-8 text with undecodable bytes kept as surrogate escapes, so any byte
survives; never pickle, the folder is not trusted code).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kb.jsontypes import JsonObject
from triage.capture.redact import redact_headers, redact_json, redact_text
from triage.proxy.record import ExchangeRecord, HeaderPairs

log = logging.getLogger("triage.proxy")

DEFAULT_INTERVAL_SECONDS = 0.02
DEFAULT_ROTATE_SECONDS = 1.0
DEFAULT_ROTATE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_JOURNAL_BYTES = 1024 * 1024 * 1024
# A frame claiming more than this is a torn or foreign header, not a record (a record is at
# most the proxy's request cap plus its record cap).
MAX_FRAME_BYTES = 64 * 1024 * 1024
REPLAY_PATIENCE_SECONDS = 60.0
SUFFIX = ".journal"
_HEADER = struct.Struct(">II")


def _text(body: bytes) -> str:
    """A body as redacted text; `_bytes` gives every other byte back (surrogate escapes).

    A JSON body is redacted as a capture's is (`redact_json`: secret-named fields, token-
    shaped strings) and written back as JSON; anything else (an SSE stream, plain text) line
    by line with `redact_text`. Both are ~10x cheaper than `redact_text` over the whole body:
    every llama-server reply holds a redaction trigger (`tokens`), which sends the whole text
    through every pattern."""
    text = body.decode("utf-8", "surrogateescape")
    if text.lstrip()[:1] in ("{", "["):
        try:
            return json.dumps(redact_json(json.loads(text)), ensure_ascii=False)
        except (ValueError, RecursionError):
            pass  # not JSON after all, or too deep: as text
    return "\n".join(redact_text(line) for line in text.split("\n"))


def _bytes(text: Any) -> bytes:
    return str(text or "").encode("utf-8", "surrogateescape")


def _text_pairs(pairs: HeaderPairs) -> list[tuple[str, str]]:
    """Header pairs as redacted text (a capture's `redact_headers`)."""
    text = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in pairs)
    return list(redact_headers(text).items())


def _byte_pairs(pairs: Any) -> HeaderPairs:
    return [
        (str(k).encode("latin-1", "replace"), str(v).encode("latin-1", "replace"))
        for k, v in pairs or ()
    ]


def encode_record(record: ExchangeRecord) -> bytes:
    """One frame for a raw record (the forwarder's: bytes bodies and header pairs), its
    secrets redacted."""
    # The journal's JSON document as written: the record's fields, bodies and headers as text.
    data: JsonObject = {k: v for k, v in record.items() if not k.startswith("_")}
    data["request_body"] = _text(record.get("request_body") or b"")
    data["response_chunks"] = _text(b"".join(record.get("response_chunks") or ()))
    data["request_headers"] = _text_pairs(record.get("request_headers") or [])
    data["response_headers"] = _text_pairs(record.get("response_headers") or [])
    data["client"] = redact_text(str(record.get("client") or ""))
    payload = json.dumps(data, separators=(",", ":")).encode("ascii")
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_record(payload: bytes) -> ExchangeRecord:
    """A frame's payload back as a raw record (bodies as bytes, header pairs as bytes)."""
    data: JsonObject = json.loads(payload.decode("ascii"))
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        raise ValueError("not a journal record")
    data["request_body"] = _bytes(data.get("request_body"))
    data["request_headers"] = _byte_pairs(data.get("request_headers"))
    data["response_headers"] = _byte_pairs(data.get("response_headers"))
    body = _bytes(data.get("response_chunks"))
    data["response_chunks"] = [body] if body else []
    # What encode_record wrote (this proxy's or an earlier one's): the record's fields.
    return cast(ExchangeRecord, data)


def read_segment(path: Path) -> Iterator[ExchangeRecord]:
    """The records of one segment, in order; a torn or corrupt frame ends it (logged)."""
    with path.open("rb") as handle:
        offset = 0
        while True:
            header = handle.read(_HEADER.size)
            if not header:
                return
            problem = ""
            if len(header) < _HEADER.size:
                problem = "a frame header cut short"
            else:
                length, crc = _HEADER.unpack(header)
                if length > MAX_FRAME_BYTES:
                    problem = f"a frame length of {length} bytes"
                else:
                    payload = handle.read(length)
                    if len(payload) < length:
                        problem = f"a record cut short ({len(payload)} of {length} bytes)"
                    elif zlib.crc32(payload) != crc:
                        problem = "a record whose checksum does not match"
                    else:
                        try:
                            record = decode_record(payload)
                        except (ValueError, TypeError, KeyError, UnicodeError):
                            problem = "a record that does not decode"
                        else:
                            yield record
                            offset += _HEADER.size + length
                            continue
            log.warning(
                "journal %s: %s at byte %d (a write cut by a crash): skipped with the rest "
                "of this segment",
                path.name,
                problem,
                offset,
            )
            return


@dataclass
class _Segment:
    path: Path
    fd: int
    opened: float
    size: int = 0
    last_seq: int = -1  # sequence number of the last record written to it


class JournaledRecorder:
    """A recorder (`Recorder` or `RecorderProcess`) with a journal in front; see the module
    docstring. Everything but `submit`, `start` and `stop` is the wrapped recorder's."""

    def __init__(
        self,
        recorder: Any,
        folder: Path,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        max_bytes: int = DEFAULT_MAX_JOURNAL_BYTES,
        replay_patience: float = REPLAY_PATIENCE_SECONDS,
    ) -> None:
        self.recorder = recorder
        self.folder = Path(folder)
        self.interval = interval
        self.rotate_seconds = rotate_seconds
        self.rotate_bytes = rotate_bytes
        self.max_bytes = max_bytes
        self.replay_patience = replay_patience
        self._lock = threading.Lock()  # submit order == sequence order (loop and replay)
        self._wake = threading.Condition(threading.Lock())
        self._pending: list[tuple[int, ExchangeRecord]] = []
        self._seq = 0  # records submitted through this journal so far
        self._written = -1  # highest sequence number handed to the OS (os.write)
        self._durable = -1  # highest sequence number fsynced
        self._io = threading.Lock()  # closing a segment's fd vs. fsyncing it
        self._dirty: set[int] = set()  # fds written since their last fsync
        self._dirty_lock = threading.Lock()
        self._synced = threading.Condition(threading.Lock())
        self._syncer: threading.Thread | None = None
        self._segments: list[_Segment] = []
        self._stamp = f"{os.getpid()}-{time.time_ns()}"
        self._opened = 0
        self._bytes = 0
        self._stop = False
        self._writer: threading.Thread | None = None
        self._replayer: threading.Thread | None = None
        self.replayed = 0
        self.skipped = 0  # not journaled: the folder was full or unwritable
        self.replay_done = threading.Event()

    def __getattr__(self, name: str) -> Any:
        if name == "recorder":
            raise AttributeError(name)
        return getattr(self.recorder, name)

    # ------------------------------------------------------------------ hot path

    def submit(self, record: ExchangeRecord) -> bool:
        """Hand the record to the recorder and queue it for the journal (no I/O here)."""
        with self._lock:
            if not self.recorder.submit(record):
                return False
            seq = self._seq
            self._seq += 1
            self._pending.append((seq, record))
        return True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._writer is not None:
            return
        if hasattr(self.recorder, "start"):
            self.recorder.start()
        self.folder.mkdir(parents=True, exist_ok=True)
        orphans = self._orphans()
        self._writer = threading.Thread(target=self._run, name="triage-journal", daemon=True)
        self._writer.start()
        self._syncer = threading.Thread(target=self._sync_loop, name="triage-fsync", daemon=True)
        self._syncer.start()
        if orphans:
            self._replayer = threading.Thread(
                target=self._replay, args=(orphans,), name="triage-journal-replay", daemon=True
            )
            self._replayer.start()
        else:
            self.replay_done.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the replay, have the recorder finish what it holds, then delete the segments
        it finished (all of them after a clean stop)."""
        if self._writer is None:
            if hasattr(self.recorder, "stop"):
                self.recorder.stop(timeout)
            return
        self._stop = True
        if self._replayer is not None:
            self._replayer.join(timeout)
        with self._wake:
            self._wake.notify()
        self._writer.join(timeout)
        self._writer = None
        self._write_pending()
        with self._synced:
            self._synced.notify()
        if self._syncer is not None:
            self._syncer.join(timeout)
            self._syncer = None
        self._fsync_dirty()
        if hasattr(self.recorder, "stop"):
            self.recorder.stop(timeout)
        self._release(final=True)

    def sync(self, timeout: float = 30.0) -> bool:
        """Block until every record submitted so far is written and fsynced."""
        target = self._seq - 1
        deadline = time.monotonic() + timeout
        while self._durable < target and time.monotonic() < deadline:
            with self._wake:
                self._wake.notify()
            time.sleep(0.005)
        return self._durable >= target

    # ------------------------------------------------------------------ writer

    def _run(self) -> None:
        while not self._stop:
            with self._wake:
                self._wake.wait(self.interval)
            try:
                self._write_pending()
                self._release(final=False)
            except Exception:  # noqa: BLE001 -- the journal must never stop the proxy
                log.exception("journal %s: write failed", self.folder)

    def _write_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        segment = self._active()
        frames: list[bytes] = []
        size = 0
        skipped = self.skipped
        for _, record in batch:
            frame = encode_record(record)
            if self._bytes + size + len(frame) > self.max_bytes:
                self.skipped += 1
                continue
            frames.append(frame)
            size += len(frame)
        if frames and segment is not None:
            data = b"".join(frames)
            try:
                written = 0
                while written < len(data):
                    written += os.write(segment.fd, data[written:])
            except OSError as exc:
                log.error("journal %s: cannot write (%s)", segment.path, exc.strerror)
                self.skipped += len(frames)
            else:
                segment.size += size
                self._bytes += size
        elif frames:
            self.skipped += len(frames)
        if segment is not None:
            segment.last_seq = batch[-1][0]
            with self._dirty_lock:
                self._dirty.add(segment.fd)
        self._written = batch[-1][0]
        with self._synced:
            self._synced.notify()
        if self.skipped > skipped:
            self._count("journal_skipped", self.skipped - skipped)
            log.warning(
                "journal %s: %d exchange(s) not journaled (full or unwritable)",
                self.folder,
                self.skipped - skipped,
            )

    def _sync_loop(self) -> None:
        """fsync whatever the writer wrote since the last round, as fast as the disk allows."""
        while not self._stop:
            with self._synced:
                if self._written == self._durable:
                    self._synced.wait(self.interval * 5)
            try:
                self._fsync_dirty()
            except Exception:  # noqa: BLE001 -- the journal must never stop the proxy
                log.exception("journal %s: fsync failed", self.folder)

    def _fsync_dirty(self) -> None:
        target = self._written
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        with self._io:
            for fd in dirty:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    log.error("journal %s: fsync failed (%s)", self.folder, exc.strerror)
        self._durable = max(self._durable, target)

    def _active(self) -> _Segment | None:
        """The segment to append to: a new one when the last is old or large enough."""
        now = time.monotonic()
        if self._segments:
            last = self._segments[-1]
            if now - last.opened < self.rotate_seconds and last.size < self.rotate_bytes:
                return last
        self._opened += 1
        path = self.folder / f"{self._stamp}-{self._opened:06d}{SUFFIX}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            log.error("journal %s: cannot open a segment (%s)", self.folder, exc.strerror)
            return None
        segment = _Segment(path, fd, now)
        self._segments.append(segment)
        _fsync_folder(self.folder)
        return segment

    def _release(self, *, final: bool) -> None:
        """Delete the segments whose every record the recorder has finished (closed ones; at
        the final stop the active one too)."""
        completed = int(getattr(self.recorder, "completed", 0))
        keep: list[_Segment] = []
        for index, segment in enumerate(self._segments):
            active = index == len(self._segments) - 1 and not final
            if not active and segment.last_seq < completed:
                with self._io, self._dirty_lock:
                    self._dirty.discard(segment.fd)
                    os.close(segment.fd)
                segment.path.unlink(missing_ok=True)
                self._bytes -= segment.size
            elif final:
                with self._io, self._dirty_lock:
                    self._dirty.discard(segment.fd)
                    os.close(segment.fd)  # kept: the next start replays it
            else:
                keep.append(segment)
        self._segments = keep

    def _count(self, metric: str, amount: int) -> None:
        metrics = getattr(self.recorder, "metrics", None)
        if metrics is not None and amount:
            getattr(metrics, metric).inc(amount)

    # ------------------------------------------------------------------ replay

    def _orphans(self) -> list[tuple[Path, int]]:
        """Segments of proxies that are gone (their lock can be taken), oldest first, each
        with an open fd holding its lock until it is replayed."""
        found = []
        for path in sorted(self.folder.glob(f"*{SUFFIX}"), key=_segment_order):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # a live proxy's
                continue
            found.append((path, fd))
        return found

    def _replay(self, orphans: list[tuple[Path, int]]) -> None:
        try:
            for path, fd in orphans:
                try:
                    if self._stop or not self._replay_segment(path):
                        break
                finally:
                    os.close(fd)
        except Exception:  # noqa: BLE001 -- a replay failure must not stop the proxy
            log.exception("journal %s: replay failed; the segments are kept", self.folder)
        finally:
            self.replay_done.set()

    def _replay_segment(self, path: Path) -> bool:
        """Submit the records of a dead proxy's segment again; delete it once they are in
        this journal. False when the recorder would not take them (the segment is kept)."""
        count = 0
        for record in read_segment(path):
            waited = 0.0
            while not self.submit(record):
                if self._stop or waited > self.replay_patience:
                    log.warning(
                        "journal %s: the recorder takes no more records; replay resumes at "
                        "the next start",
                        path.name,
                    )
                    return False
                time.sleep(0.05)
                waited += 0.05
            count += 1
        if not self.sync():
            return False
        path.unlink(missing_ok=True)
        self.replayed += count
        self._count("journal_replayed", count)
        if count:
            log.info("journal: %d exchange(s) replayed from %s", count, path.name)
        return True


def _segment_order(path: Path) -> tuple[int, str]:
    parts = path.name.split("-")
    try:
        return int(parts[1]), path.name
    except (IndexError, ValueError):
        return 0, path.name


def _fsync_folder(folder: Path) -> None:
    """A new file's name is durable once its folder is fsynced."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
