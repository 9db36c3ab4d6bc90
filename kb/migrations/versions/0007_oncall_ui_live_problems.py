"""live proxy: request shape and client-configured failures per exchange; problem per signature

Revision ID: 0007_oncall_ui_live_problems
Revises: 0006_newcauses_server_flags
Create Date: 2026-12-01

`liveexchange.shape`: the request's shape (endpoint, streaming, tools, format, stop list,
token limit) -- the proxy groups failures per model x shape x primary symptom and needs a
minimum of exchanges of one shape before it opens an incident. `liveexchange.client_limit`:
why a failure is what the client configured (its own max_tokens or stop list), "" when it
is not. `livesignature.problem`: the problem (primary symptom, status class, shape) a
signature row belongs to: several signatures (symptom variants) share one incident.

Self-contained (no imports from kb), like the migrations before it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_oncall_ui_live_problems"
down_revision = "0006_newcauses_server_flags"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("liveexchange") as batch:
        batch.add_column(
            sa.Column("shape", sa.String(length=100), nullable=False, server_default="")
        )
        batch.add_column(
            sa.Column("client_limit", sa.String(length=200), nullable=False, server_default="")
        )
    op.create_index(
        "ix_liveexchange_model_shape", "liveexchange", ["model", "shape", "recorded_at"]
    )
    with op.batch_alter_table("livesignature") as batch:
        batch.add_column(
            sa.Column("problem", sa.String(length=300), nullable=False, server_default="")
        )
    op.create_index("ix_livesignature_problem", "livesignature", ["model", "problem"])


def downgrade() -> None:
    op.drop_index("ix_livesignature_problem", table_name="livesignature")
    with op.batch_alter_table("livesignature") as batch:
        batch.drop_column("problem")
    op.drop_index("ix_liveexchange_model_shape", table_name="liveexchange")
    with op.batch_alter_table("liveexchange") as batch:
        batch.drop_column("client_limit")
        batch.drop_column("shape")
