"""vocabulary: the model-file lint kinds (19-21) and template-markup-in-content (28)

Revision ID: 0013_real23_lint_vocab
Revises: 0012_cause24_stream_format
Create Date: 2026-12-01

kb.vocab gives bits to four new finding kinds: every stored family signature is marked stale,
so kb.repo.family recomputes it on the next refresh (as 0006 did). Self-contained (no imports
from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_real23_lint_vocab"
down_revision = "0012_cause24_stream_format"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
