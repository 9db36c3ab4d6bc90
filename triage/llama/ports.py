"""Loopback ports for llama-server: a free one, whether one is taken, and (Linux /proc) which
process group holds the socket listening on one."""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["LOOPBACK", "free_port", "group_socket_inodes", "listening_inodes", "port_in_use"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True when something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on `port` (Linux /proc/net/tcp*); None when unreadable."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # local_address is ADDR:PORT in hex; state 0A is LISTEN; field 9 the inode.
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])
    return found if readable else None


def group_socket_inodes(pgid: int) -> set[str]:
    """Socket inodes held open by the processes of process group `pgid`."""
    inodes: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:  # fields: state ppid pgrp
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return inodes
