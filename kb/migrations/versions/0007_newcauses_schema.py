"""vocabulary: the schema-violation finding kind (24)

Revision ID: 0007_newcauses_schema
Revises: 0006_newcauses_server_flags
Create Date: 2026-12-01

kb.vocab gives bits to a new finding kind: every stored family
signature is marked stale, so kb.repo.family recomputes it on the next refresh (as 0003_vocab
did). Self-contained (no imports from kb).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_newcauses_schema"
down_revision = "0006_newcauses_server_flags"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
