"""vocabulary: the gateway-timeout cause (18) and the gateway-error finding kind (22)

Revision ID: 0005_newcauses_gateway
Revises: 0004_merge_vocab_live
Create Date: 2026-12-01

kb.vocab gives bits to a new cause id and a new finding kind: every stored family
signature is marked stale, so kb.repo.family recomputes it on the next refresh (as 0003_vocab
did). Self-contained (no imports from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_newcauses_gateway"
down_revision = "0004_merge_vocab_live"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
