"""Reading capture input: bounded file reads and strict UTF-8 decoding."""

from __future__ import annotations

import sys
from pathlib import Path

from triage.capture import model
from triage.capture.model import CaptureError

__all__ = ["decode", "max_capture_bytes", "read_file"]


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


def read_file(path: str | Path) -> bytes:
    """A capture file's bytes, refusing directories and files over MAX_CAPTURE_BYTES."""
    p = Path(path)
    name = str(path)
    try:
        size = p.stat().st_size
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CaptureError(name, None, f"cannot open: {reason}") from None
    if p.is_dir():
        raise CaptureError(name, None, "is a directory")
    limit = max_capture_bytes()
    if size > limit:
        raise CaptureError(name, None, f"file is {size} bytes, {_over(limit)}")
    try:
        with p.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise CaptureError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise CaptureError(name, None, f"file is {_over(limit)}")
    return data


def _over(limit: int) -> str:
    mib = f" ({limit // (1024 * 1024)} MiB)" if limit % (1024 * 1024) == 0 else ""
    return f"over the {limit} byte limit{mib}"
