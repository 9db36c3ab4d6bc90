"""The knowledge base's refusal: a write or decision it will not make, with what is wrong."""

from __future__ import annotations

__all__ = ["StoreError"]


class StoreError(Exception):
    """A write that the knowledge base refuses; the message names what is wrong."""
