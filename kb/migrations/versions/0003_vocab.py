"""stored vocabulary numbers; family signatures recomputed with number-based bits

Revision ID: 0003_vocab
Revises: 0002_search
Create Date: 2026-12-01

`vocabnumber` records, per numbered catalogue section (`cause`, `check`), the number each
id was first used with, so that a catalogue whose numbering moved can be refused before
it mis-reads stored bit masks (kb/vocab.py, triage/catalogue/numbering.py).

Bits in `incidentsignature` now come from kb.vocab's explicit numbers, which also gives
bits to the reserved cause ids (cpu-backend ... model-file) that were matched by text
before: every signature is marked stale, so kb.repo.family recomputes it on the next refresh
(and scores it from its rows until then).

Self-contained (no imports from kb): a migration must keep doing what it did when it shipped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_vocab"
down_revision = "0002_search"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vocabnumber",
        sa.Column("section", sa.String(length=20), nullable=False),
        sa.Column("term_id", sa.String(length=100), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("section", "term_id"),
        sa.UniqueConstraint("section", "number"),
    )
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))


def downgrade() -> None:
    op.drop_table("vocabnumber")
    # The old tuple-order bits equal the numbers for the ids that had bits then; the
    # reserved causes lose theirs, so recompute.
    op.execute(sa.text("UPDATE incidentsignature SET stale = :stale").bindparams(stale=True))
