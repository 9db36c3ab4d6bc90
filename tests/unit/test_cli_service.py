"""The CLI reaches the knowledge base through kb.service only: no command module and no
atlas module imports storage (kb.repo, kb.models, SQLAlchemy), and what the new service
modules export is there."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

import kb.service
import kb.service.bisect
import kb.service.search
import kb.service.settings

TRIAGE = Path(__file__).resolve().parents[2] / "triage"
FORBIDDEN = ("sqlalchemy", "sqlmodel", "alembic", "kb.repo", "kb.models", "kb.migrations")
# Still on the store, owned elsewhere this session: the diagnose path (commands/engine.py)
# and `open_store`, which only it uses (commands/__init__.py).
NOT_YET = {"engine.py": "kb.repo", "__init__.py": "kb.repo.store"}
MODULES = sorted([*(TRIAGE / "commands").glob("*.py"), *(TRIAGE / "atlas").glob("*.py")])


def _storage_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found += [n for n in names if any(n == b or n.startswith(b + ".") for b in FORBIDDEN)]
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_cli_module_does_not_reach_into_storage(path: Path) -> None:
    found = _storage_imports(path.read_text(encoding="utf-8"))
    allowed = NOT_YET.get(path.name) if path.parent.name == "commands" else None
    assert [name for name in found if not (allowed and name.startswith(allowed))] == []


def test_the_checker_sees_a_storage_import() -> None:
    source = "from kb.repo.search import search\nimport sqlalchemy.orm\nfrom kb import service\n"
    assert _storage_imports(source) == ["kb.repo.search", "sqlalchemy.orm"]


@pytest.mark.parametrize(
    "module", [kb.service, kb.service.bisect, kb.service.search, kb.service.settings]
)
def test_every_exported_name_exists(module: ModuleType) -> None:
    names = module.__all__
    assert names and all(hasattr(module, name) for name in names)
