"""The catalogue: one registry of causes, probe arms, symptom checks, capture formats and
revisit trigger kinds, filled from the `triage.plugins` entry points (built-ins included).

    from triage.catalogue import catalogue
    catalogue().causes["speculative-decoding"]

A plugin is a module with `register(catalogue: Catalogue) -> None`; see README "Layout".
"""

from __future__ import annotations

import functools

from triage.catalogue.registry import ENTRY_POINT_GROUP, Catalogue, CatalogueError, Section

__all__ = ["ENTRY_POINT_GROUP", "Catalogue", "CatalogueError", "Section", "catalogue"]


@functools.cache
def catalogue() -> Catalogue:
    """The process-wide catalogue, loaded once from the installed entry points."""
    return Catalogue.load()
