"""Benchmarks measure; they never fail for being slow. pyproject's global pytest timeout
(300 s, a guard against hung tests) is lifted for every test in this folder."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(__file__.rsplit("/", 1)[0]):
            item.add_marker(pytest.mark.timeout(0))
