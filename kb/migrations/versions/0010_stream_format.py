"""vocabulary: the stream-format-violation finding kind (25)

Revision ID: 0010_stream_format
Revises: 0009_prompt_cache_vocab
Create Date: 2026-12-01

kb.vocab gives bits to a new finding kind: every stored family
signature is marked stale, so kb.repo.family recomputes it on the next refresh (as 0003_vocab
did). Self-contained (no imports from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_stream_format"
down_revision = "0009_prompt_cache_vocab"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
