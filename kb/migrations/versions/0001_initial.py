"""initial schema

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "incident",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=200), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("opened_on", sa.Date(), nullable=False),
        sa.Column("closed_on", sa.Date(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("impact", sa.Text(), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("weights", sa.String(length=300), nullable=False),
        sa.Column("server_build", sa.String(length=100), nullable=False),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.Column("stack", sa.JSON(), nullable=False),
        sa.Column("timeline", sa.JSON(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("source_file", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("incident", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_incident_slug"), ["slug"], unique=True)
        batch_op.create_index(batch_op.f("ix_incident_status"), ["status"], unique=False)

    op.create_table(
        "cause",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("catalogue_id", sa.String(length=100), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("basis", sa.String(length=20), nullable=False),
        sa.Column("rationale", sa.Text(), nullable=False),
        sa.Column("deciding_probe", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("incident_id", "key"),
    )
    with op.batch_alter_table("cause", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cause_catalogue_id"), ["catalogue_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_cause_incident_id"), ["incident_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_cause_status"), ["status"], unique=False)

    op.create_table(
        "decision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(length=200), nullable=False),
        sa.Column("rationale", sa.Text(), nullable=False),
        sa.Column("tradeoff", sa.Text(), nullable=False),
        sa.Column("fix", sa.Text(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("revisit_on", sa.Date(), nullable=True),
        sa.Column("revisit_triggers", sa.JSON(), nullable=False),
        sa.Column("evidence_keys", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("decision", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_decision_incident_id"), ["incident_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_decision_kind"), ["kind"], unique=False)

    op.create_table(
        "reference",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reference", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_reference_incident_id"), ["incident_id"], unique=False)

    op.create_table(
        "symptom",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("observed", sa.JSON(), nullable=False),
        sa.Column("evidence_keys", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("incident_id", "key"),
    )
    with op.batch_alter_table("symptom", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_symptom_incident_id"), ["incident_id"], unique=False)

    op.create_table(
        "triagerun",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("triagerun", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_triagerun_incident_id"), ["incident_id"], unique=False)

    op.create_table(
        "causestatuschange",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cause_id", sa.Integer(), nullable=False),
        sa.Column("from_status", sa.String(length=20), nullable=True),
        sa.Column("to_status", sa.String(length=20), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("rationale", sa.Text(), nullable=False),
        sa.Column("evidence_keys", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["cause_id"], ["cause.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("causestatuschange", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_causestatuschange_cause_id"), ["cause_id"], unique=False
        )

    op.create_table(
        "evidence",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["triagerun.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("incident_id", "key"),
    )
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evidence_incident_id"), ["incident_id"], unique=False)
        batch_op.create_index("ix_evidence_kind_recorded", ["kind", "recorded_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_evidence_run_id"), ["run_id"], unique=False)

    op.create_table(
        "familylink",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("from_cause_id", sa.Integer(), nullable=False),
        sa.Column("to_cause_id", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["from_cause_id"], ["cause.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["to_cause_id"], ["cause.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("from_cause_id", "to_cause_id"),
    )
    with op.batch_alter_table("familylink", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_familylink_from_cause_id"), ["from_cause_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_familylink_to_cause_id"), ["to_cause_id"], unique=False
        )

    op.create_table(
        "evidencelink",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cause_id", sa.Integer(), nullable=False),
        sa.Column("evidence_id", sa.Integer(), nullable=False),
        sa.Column("relation", sa.String(length=20), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["cause_id"], ["cause.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["evidence_id"], ["evidence.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cause_id", "evidence_id", "relation"),
    )
    with op.batch_alter_table("evidencelink", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evidencelink_cause_id"), ["cause_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_evidencelink_evidence_id"), ["evidence_id"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("evidencelink", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evidencelink_evidence_id"))
        batch_op.drop_index(batch_op.f("ix_evidencelink_cause_id"))

    op.drop_table("evidencelink")
    with op.batch_alter_table("familylink", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_familylink_to_cause_id"))
        batch_op.drop_index(batch_op.f("ix_familylink_from_cause_id"))

    op.drop_table("familylink")
    with op.batch_alter_table("evidence", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evidence_run_id"))
        batch_op.drop_index("ix_evidence_kind_recorded")
        batch_op.drop_index(batch_op.f("ix_evidence_incident_id"))

    op.drop_table("evidence")
    with op.batch_alter_table("causestatuschange", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_causestatuschange_cause_id"))

    op.drop_table("causestatuschange")
    with op.batch_alter_table("triagerun", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_triagerun_incident_id"))

    op.drop_table("triagerun")
    with op.batch_alter_table("symptom", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_symptom_incident_id"))

    op.drop_table("symptom")
    with op.batch_alter_table("reference", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reference_incident_id"))

    op.drop_table("reference")
    with op.batch_alter_table("decision", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decision_kind"))
        batch_op.drop_index(batch_op.f("ix_decision_incident_id"))

    op.drop_table("decision")
    with op.batch_alter_table("cause", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cause_status"))
        batch_op.drop_index(batch_op.f("ix_cause_incident_id"))
        batch_op.drop_index(batch_op.f("ix_cause_catalogue_id"))

    op.drop_table("cause")
    with op.batch_alter_table("incident", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_incident_status"))
        batch_op.drop_index(batch_op.f("ix_incident_slug"))

    op.drop_table("incident")
