"""Reading capture input: bounded file reads and strict UTF-8 decoding."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from triage.capture import model
from triage.capture.model import CaptureError

__all__ = ["decode", "max_capture_bytes", "read_beside", "read_file"]


def max_capture_bytes() -> int:
    """The size limit: `triage.capture.MAX_CAPTURE_BYTES` is the public knob (set it there)."""
    package = sys.modules.get("triage.capture")
    return int(getattr(package, "MAX_CAPTURE_BYTES", model.MAX_CAPTURE_BYTES))


def decode(data: bytes | str, file: str) -> tuple[str, bytes]:
    """Text and raw bytes of an input, enforcing the size limit and strict UTF-8."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CaptureError(
                file, None, f"text holds unpaired surrogates at char {exc.start}"
            ) from None
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        raise CaptureError(file, None, f"expected bytes or text, got {type(data).__name__}")
    limit = max_capture_bytes()
    if len(raw) > limit:
        raise CaptureError(file, None, f"file is {len(raw)} bytes, {_over(limit)}")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise CaptureError(
                file, line, f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
            ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise CaptureError(file, line, "NUL byte in a text capture (binary file?)")
    return text, raw


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _open_error(name: str, exc: BaseException) -> CaptureError:
    if isinstance(exc, IsADirectoryError):
        return CaptureError(name, None, "is a directory")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return CaptureError(name, None, f"cannot open: {reason}")


def read_file(path: str | Path, *, name: str | None = None) -> bytes:
    """A capture file's bytes, read with a byte limit (MAX_CAPTURE_BYTES + 1 at most, whatever
    the file claims its size is); directories, devices, FIFOs and sockets are refused.

    The file is opened non-blocking, so a FIFO without a writer cannot hang the read, and
    checked with fstat on that same descriptor (no race with a swapped path).
    """
    name = str(path) if name is None else name
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise _open_error(name, exc) from None
    try:
        info = os.fstat(fd)
        _refuse_non_regular(name, info.st_mode)
        limit = max_capture_bytes()
        if info.st_size > limit:
            raise CaptureError(name, None, f"file is {info.st_size} bytes, {_over(limit)}")
        handle = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            data = _read_at_most(handle, limit + 1)
        except OSError as exc:
            raise CaptureError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise CaptureError(name, None, f"file is {_over(limit)}")
    return data


def _refuse_non_regular(name: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise CaptureError(name, None, "is a directory")
    for test, kind in _NOT_REGULAR:
        if test(mode):
            raise CaptureError(name, None, f"is {kind}, not a regular file")


def _read_at_most(handle: BinaryIO, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = handle.read(min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_beside(base_dir: Path, target: str, *, file: str, line: int | None) -> tuple[Path, bytes]:
    """A file a capture refers to (`curl -d @PATH`), only from the capture's own folder (or
    below it, symlinks resolved), read with the same limits as the capture itself."""
    candidate = Path(target)
    path = candidate if candidate.is_absolute() else base_dir / candidate
    try:
        resolved = path.resolve(strict=True)
        folder = base_dir.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        raise CaptureError(file, line, f"body file {target!r} not found") from None
    if not resolved.is_relative_to(folder):
        raise CaptureError(
            file,
            line,
            f"body file {target!r} is outside the capture's folder ({folder}); "
            "copy it next to the capture",
        )
    return resolved, read_file(resolved, name=str(path))


def _over(limit: int) -> str:
    mib = f" ({limit // (1024 * 1024)} MiB)" if limit % (1024 * 1024) == 0 else ""
    return f"over the {limit} byte limit{mib}"
