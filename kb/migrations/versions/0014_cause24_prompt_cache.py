"""vocabulary: the prompt-cache cause (21)

Revision ID: 0014_cause24_prompt_cache
Revises: 0013_real23_lint_vocab
Create Date: 2026-12-01

kb.vocab gives a bit to a new cause: every stored family signature is marked stale, so
kb.repo.family recomputes it on the next refresh (as 0012 did). Self-contained (no imports from
kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_cause24_prompt_cache"
down_revision = "0013_real23_lint_vocab"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
