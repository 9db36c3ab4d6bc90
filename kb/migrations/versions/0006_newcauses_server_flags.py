"""vocabulary: the server-flags cause (19) and the server-flag-error finding kind (23)

Revision ID: 0006_newcauses_server_flags
Revises: 0005_newcauses_gateway
Create Date: 2026-12-01

kb.vocab gives bits to a new cause id and a new finding kind: every stored family
signature is marked stale, so kb.repo.family recomputes it on the next refresh (as 0003_vocab
did). Self-contained (no imports from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_newcauses_server_flags"
down_revision = "0005_newcauses_gateway"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
