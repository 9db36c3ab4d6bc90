"""Join the two heads of the same afternoon (live-problem tables, newcauses vocabulary) into
one head.

Revision ID: 0008_newcauses_merge_heads
Revises: 0007_oncall_ui_live_problems, 0007_newcauses_schema
"""

from __future__ import annotations

revision = "0008_newcauses_merge_heads"
down_revision = ("0007_oncall_ui_live_problems", "0007_newcauses_schema")
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: both parents touch disjoint tables."""


def downgrade() -> None:
    """Nothing to change."""
