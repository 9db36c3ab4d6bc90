"""vocabulary: the embedding-failed finding kind (27)

Revision ID: 0011_embed_batch_vocab
Revises: 0010_stream_format
Create Date: 2026-12-01

kb.vocab gives a bit to a new finding kind: every stored family signature is marked stale,
so kb.repo.family recomputes it on the next refresh (as 0006 did). Self-contained (no imports
from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_embed_batch_vocab"
down_revision = "0010_stream_format"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
