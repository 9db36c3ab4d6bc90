"""Install a one-module plugin distribution for a test: a module and a dist-info folder
with a `triage.plugins` entry point, found by importlib.metadata through sys.path (what
`pip install` of a real plugin leaves behind), and a fresh process catalogue."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from triage.catalogue import catalogue


@contextmanager
def installed(tmp_path: Path, module: str, source: str) -> Iterator[None]:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[triage.plugins]\n{name} = {module}\n")
    # Not monkeypatch.syspath_prepend: the plugin must be gone when the block ends.
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    catalogue.cache_clear()
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))
        importlib.invalidate_caches()
        catalogue.cache_clear()
        sys.modules.pop(module, None)
