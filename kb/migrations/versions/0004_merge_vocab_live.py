"""Join the two 0003 branches (vocabulary numbers, live proxy tables) into one head.

Revision ID: 0004_merge_vocab_live
Revises: 0003_vocab, 0003_live
"""

from __future__ import annotations

revision = "0004_merge_vocab_live"
down_revision = ("0003_vocab", "0003_live")
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: both parents touch disjoint tables."""


def downgrade() -> None:
    """Nothing to change."""
