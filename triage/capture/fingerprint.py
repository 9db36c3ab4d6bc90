"""Fingerprints for redaction markers: HMAC-SHA256 under a per-installation secret key.

A marker must let a team see that two captures carry the same secret, without letting
anyone who reads the knowledge base (or an export of it) confirm a guessed key offline,
which an unsalted hash allows. The key is 32 random bytes created on first use in the data
directory (`$TRIAGE_HOME/redaction.key`, mode 0600) -- never in the knowledge base, so a
database or its exported files alone cannot be tested against guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from kb.repo.engine import data_dir

__all__ = ["KEY_FILE_NAME", "fingerprint", "key_path"]

KEY_FILE_NAME = "redaction.key"
_KEY_BYTES = 32
_FINGERPRINT_HEX = 12

_log = logging.getLogger(__name__)
_keys: dict[Path, bytes] = {}
_process_key = secrets.token_bytes(_KEY_BYTES)


def key_path() -> Path:
    """Where this installation's key lives (the data directory of kb.repo.store)."""
    return data_dir() / KEY_FILE_NAME


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_mode & 0o077:
            os.fchmod(handle.fileno(), 0o600)  # tighten a copied key rather than leak it
        text = handle.read(4 * _KEY_BYTES).decode("ascii", "replace").strip()
    key = bytes.fromhex(text) if len(text) == 2 * _KEY_BYTES else b""
    if len(key) != _KEY_BYTES:
        raise OSError(f"{path} does not hold a {_KEY_BYTES}-byte hex key")
    return key


def _create_key(path: Path) -> bytes:
    """Write a new key atomically: a private temp file, then link() (fails if another
    process won the race, whose key is then read instead)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_bytes(_KEY_BYTES)
    temp = path.with_name(f".{KEY_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.hex().encode("ascii") + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            existing = _read_key(path)
            if existing is None:
                raise
            return existing
    finally:
        temp.unlink(missing_ok=True)
    return key


def installation_key() -> bytes:
    """This installation's key: read, or created on first use. If the data directory cannot
    hold it, a per-process key is used (markers then match within one run only) -- never
    no key at all."""
    path = key_path()
    cached = _keys.get(path)
    if cached is not None:
        return cached
    try:
        key = _read_key(path) or _create_key(path)
    except (OSError, ValueError) as exc:
        _log.warning(
            "redaction key unavailable (%s); markers match within this run only", type(exc).__name__
        )
        key = _process_key
    _keys[path] = key
    return key


def fingerprint(value: str) -> str:
    """A short HMAC-SHA256 of `value` under the installation key (hex)."""
    digest = hmac.new(
        installation_key(), value.encode("utf-8", "surrogatepass"), hashlib.sha256
    ).hexdigest()
    return digest[:_FINGERPRINT_HEX]
