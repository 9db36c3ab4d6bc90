"""The knowledge base's two layers: kb.domain holds the rules and records (no SQL, no
database, no file I/O), kb.repo the storage; the rules never reach into storage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KB = Path(__file__).resolve().parents[2] / "kb"
DOMAIN = sorted((KB / "domain").glob("*.py"))
# Storage packages and database libraries a pure rule must not import.
FORBIDDEN = ("sqlalchemy", "sqlmodel", "alembic", "kb.repo", "kb.models", "kb.migrations")
# Calls that read or write files.
FILE_IO = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink"}


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Modules imported when the module runs (an `if TYPE_CHECKING:` block does not run)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_domain_package_has_its_modules() -> None:
    names = {path.stem for path in DOMAIN}
    # The policy the issue names: evidence strength (decisions), family matching, retro
    # text, decision rules; slugs and text guards.
    assert {"decisions", "family", "retro", "retrotext", "slugs", "textguard"} <= names


@pytest.mark.parametrize("path", DOMAIN, ids=lambda path: path.stem)
def test_a_domain_module_imports_no_storage(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        name
        for name in _runtime_imports(tree)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    ]
    assert found == [], f"{path.name} imports storage: {found}"


@pytest.mark.parametrize("path", DOMAIN, ids=lambda path: path.stem)
def test_a_domain_module_does_no_file_io(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [
        ast.unparse(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in FILE_IO)
            or (isinstance(node.func, ast.Attribute) and node.func.attr in FILE_IO)
        )
    ]
    # The diagnosis schema is package data read once (kb.domain.diagnosis); nothing else.
    allowed = {
        "diagnosis": ["resources.files('kb').joinpath('schemas/diagnosis.schema.json').read_text"]
    }
    assert calls == allowed.get(path.stem, []), f"{path.name} does file I/O: {calls}"


def test_the_checker_sees_a_storage_import() -> None:
    """The check above fails on a module that does import storage (it is not vacuous)."""
    tree = ast.parse("from kb.repo.store import Store\nimport sqlmodel\n")
    assert {"kb.repo.store", "sqlmodel"} <= set(_runtime_imports(tree))
    guarded = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sqlmodel\n"
    )
    assert "sqlmodel" not in _runtime_imports(guarded)


LAYERED = sorted([*DOMAIN, *(KB / "repo").glob("*.py")])


@pytest.mark.parametrize("path", LAYERED, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_kb_module_imports_at_its_top(path: Path) -> None:
    """Imports sit at the top of the module (a function that imports hides a dependency)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = [
        f"{node.name}: {ast.unparse(statement)}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for statement in ast.walk(node)
        if isinstance(statement, (ast.Import, ast.ImportFrom))
    ]
    assert inside == [], f"{path.name} imports inside functions: {inside}"
