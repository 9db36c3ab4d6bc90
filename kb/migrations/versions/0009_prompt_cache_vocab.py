"""vocabulary: the unstable-prefix finding kind (26)

Revision ID: 0009_prompt_cache_vocab
Revises: 0008_newcauses_merge_heads
Create Date: 2026-12-01

kb.vocab gives bits to a new finding kind: every stored family
signature is marked stale, so kb.repo.family recomputes it on the next refresh (as 0003_vocab
did). Self-contained (no imports from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_prompt_cache_vocab"
down_revision = "0008_newcauses_merge_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
