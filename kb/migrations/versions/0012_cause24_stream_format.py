"""vocabulary: the stream-format cause (22)

Revision ID: 0012_cause24_stream_format
Revises: 0011_embed_batch_vocab
Create Date: 2026-12-01

kb.vocab gives a bit to a new cause: every stored family signature is marked stale, so
kb.repo.family recomputes it on the next refresh (as 0007 did). Self-contained (no imports from
kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_cause24_stream_format"
down_revision = "0011_embed_batch_vocab"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
