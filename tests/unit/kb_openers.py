"""Worker for the fresh-knowledge-base race (spawned processes import only this and kb)."""

from __future__ import annotations

from typing import Any

from kb.repo.store import Store


def open_fresh(url: str, ready: Any, results: Any) -> None:
    """Wait until every worker is ready, open (and so migrate) the store, report."""
    ready.wait(timeout=120)  # every process imported and waiting: open at the same moment
    try:
        Store(url).close()
        results.put("ok")
    except BaseException as exc:  # reported by the test
        results.put(f"{type(exc).__name__}: {exc}")
