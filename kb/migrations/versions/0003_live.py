"""live proxy: recorded exchanges and the signatures it opened incidents for

Revision ID: 0003_live
Revises: 0002_search
Create Date: 2026-12-01

`liveexchange`: one row per exchange recorded by `triage proxy` (redacted, body compressed,
successes possibly sampled out), unique on the proxy's idempotency key so that a spooled
exchange replayed after a restart is stored once. `livesignature`: one row per failure
signature with an incident, unique on (model, signature), so that two replicas sharing a
database cannot open two incidents for the same failure.

Self-contained (no imports from kb), like the migrations before it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_live"
down_revision = "0002_search"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "liveexchange",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replica", sa.String(length=100), nullable=False),
        sa.Column("path", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("client", sa.String(length=200), nullable=False),
        sa.Column("signature", sa.String(length=300), nullable=False),
        sa.Column("failed", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("elapsed_ms", sa.Float(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("upstream_build", sa.String(length=100), nullable=False),
        sa.Column("template_sha256", sa.String(length=64), nullable=False),
        sa.Column("findings", sa.JSON(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("body_truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_liveexchange_recorded_at", "liveexchange", ["recorded_at"])
    op.create_index(
        "ix_liveexchange_cell", "liveexchange", ["model", "client", "signature", "recorded_at"]
    )
    op.create_index("ix_liveexchange_model_recorded", "liveexchange", ["model", "recorded_at"])
    op.create_table(
        "livesignature",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=400), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("signature", sa.String(length=300), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("opened_by", sa.String(length=100), nullable=False),
        sa.Column("first_exchange_key", sa.String(length=64), nullable=False),
        sa.Column("latest_exchange_key", sa.String(length=64), nullable=False),
        sa.Column("detection", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_livesignature_incident_id", "livesignature", ["incident_id"])


def downgrade() -> None:
    op.drop_index("ix_livesignature_incident_id", table_name="livesignature")
    op.drop_table("livesignature")
    op.drop_index("ix_liveexchange_model_recorded", table_name="liveexchange")
    op.drop_index("ix_liveexchange_cell", table_name="liveexchange")
    op.drop_index("ix_liveexchange_recorded_at", table_name="liveexchange")
    op.drop_table("liveexchange")
