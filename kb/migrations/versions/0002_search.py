"""full-text search index and per-incident family signatures

Revision ID: 0002_search
Revises: 0001_initial
Create Date: 2026-11-29

One search document per incident, `incidentsearch`, with a column per field group
(title, stack, summary, body, symptoms, causes, evidence, decisions):

- SQLite: an FTS5 table (rowid = incident.id, porter + unicode61 tokenizer, weighted bm25
  as its `rank`), storing its own copy of the text so that updates need no old values.
- PostgreSQL: a plain table with a generated, weighted `tsvector` column and a GIN index.

Triggers on incident, symptom, cause, evidence and decision keep the document current for
every writer: an insert appends its text to the field group, an update or delete recomputes
the group from the base table. On PostgreSQL the recompute first locks the document row so
that two concurrent writers cannot overwrite each other's text with a stale aggregate.

`incidentsignature` holds one compact family signature per incident (bit masks of finding
kinds and confirmed causes plus the stack fingerprint). It is computed in Python
(kb.repo.family.refresh_signatures); the triggers here only mark it `stale` when an incident's
stack, symptoms or causes change, and kb.repo.family scores stale rows on the fly.

The upgrade indexes existing rows in bulk; the downgrade drops everything it created.
This file is deliberately self-contained (no imports from kb): a migration must keep
doing what it did when it shipped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_search"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

# Field group -> (base table, SQL text of one row in terms of the row alias `r`).
CHILD_GROUPS = {
    "symptoms": ("symptom", "r.kind || ' ' || r.description"),
    "causes": (
        "cause",
        "r.title || ' ' || r.rationale || ' ' || r.key || ' ' || r.catalogue_id || ' ' || r.status",
    ),
    "evidence": ("evidence", "r.summary"),
    "decisions": ("decision", "r.kind || ' ' || r.rationale || ' ' || r.tradeoff || ' ' || r.fix"),
}
# Incident-level groups, in terms of the incident row alias `r`; {flags} is the dialect's
# text of the JSON flags column.
INCIDENT_GROUPS = {
    "title": "r.title",
    "stack": "r.model || ' ' || r.weights || ' ' || r.server_build || ' ' || {flags}",
    "summary": "r.summary || ' ' || r.impact",
    "body": "r.body",
}
COLUMNS = ("title", "stack", "summary", "body", "symptoms", "causes", "evidence", "decisions")
# SQLite bm25 weights, in COLUMNS order: a hit in the title counts most, the long free-text
# groups (body, evidence) least.
BM25_WEIGHTS = (10.0, 2.0, 5.0, 1.0, 4.0, 4.0, 1.0, 3.0)
# PostgreSQL tsvector weight class per group (A highest). Each group is capped in length so
# that no document can exceed the 1 MB tsvector limit and make a write fail.
PG_WEIGHTS = {
    "title": ("A", 10_000),
    "summary": ("B", 50_000),
    "symptoms": ("B", 50_000),
    "causes": ("B", 50_000),
    "decisions": ("C", 50_000),
    "stack": ("C", 10_000),
    "body": ("D", 200_000),
    "evidence": ("D", 200_000),
}
# Tables whose changes make an incident's family signature stale.
SIGNATURE_CHILDREN = ("symptom", "cause")
SIGNATURE_INCIDENT_COLUMNS = ("model", "weights", "server_build", "flags", "stack")
SEARCH_INCIDENT_COLUMNS = (
    "title",
    "summary",
    "impact",
    "body",
    "model",
    "weights",
    "server_build",
    "flags",
)


def _incident_expr(group: str, dialect: str, alias: str = "r") -> str:
    flags = f"{alias}.flags" if dialect == "sqlite" else f"{alias}.flags::text"
    return INCIDENT_GROUPS[group].format(flags=flags).replace("r.", f"{alias}.")


def _child_expr(group: str, alias: str) -> str:
    return CHILD_GROUPS[group][1].replace("r.", f"{alias}.")


def _aggregate(group: str, dialect: str, incident_id: str) -> str:
    """SQL: the full text of one child group of an incident, rows in id order."""
    table, _expr = CHILD_GROUPS[group]
    expr = _child_expr(group, "c")
    if dialect == "sqlite":
        return (
            f"coalesce((SELECT group_concat(t, char(10)) FROM (SELECT {expr} AS t "
            f"FROM {table} c WHERE c.incident_id = {incident_id} ORDER BY c.id)), '')"
        )
    return (
        f"coalesce((SELECT string_agg({expr}, E'\\n' ORDER BY c.id) FROM {table} c "
        f"WHERE c.incident_id = {incident_id}), '')"
    )


def _signature_table() -> None:
    op.create_table(
        "incidentsignature",
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("stale", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("kinds_mask", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("causes_mask", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("kinds", sa.Text(), nullable=False, server_default=""),
        sa.Column("causes", sa.Text(), nullable=False, server_default=""),
        sa.Column("model_family", sa.String(length=50), nullable=False, server_default=""),
        sa.Column("server_build", sa.String(length=50), nullable=False, server_default=""),
        sa.Column("spec", sa.String(length=8), nullable=False, server_default=""),
        sa.Column("thinking", sa.String(length=8), nullable=False, server_default=""),
        sa.Column("kinds_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("causes_count", sa.Integer(), nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(["incident_id"], ["incident.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("incident_id"),
    )
    op.create_index(
        "ix_incidentsignature_stale",
        "incidentsignature",
        ["stale"],
        sqlite_where=sa.text("stale = 1"),  # the form SQLAlchemy renders for `stale == True`
        postgresql_where=sa.text("stale"),
    )
    op.execute("INSERT INTO incidentsignature (incident_id) SELECT id FROM incident")


# ----------------------------------------------------------------------------- SQLite


def _sqlite_upgrade() -> None:
    columns = ", ".join(COLUMNS)
    op.execute(
        f"CREATE VIRTUAL TABLE incidentsearch USING fts5({columns}, "
        "tokenize = 'porter unicode61 remove_diacritics 2')"
    )
    weights = ", ".join(str(w) for w in BM25_WEIGHTS)
    op.execute(
        f"INSERT INTO incidentsearch (incidentsearch, rank) VALUES ('rank', 'bm25({weights})')"
    )
    values = ", ".join(
        [_incident_expr(g, "sqlite", "i") for g in INCIDENT_GROUPS]
        + [_aggregate(g, "sqlite", "i.id") for g in CHILD_GROUPS]
    )
    op.execute(
        f"INSERT INTO incidentsearch (rowid, {', '.join(INCIDENT_GROUPS)}, "
        f"{', '.join(CHILD_GROUPS)}) SELECT i.id, {values} FROM incident i"
    )

    incident_values = ", ".join(_incident_expr(g, "sqlite", "NEW") for g in INCIDENT_GROUPS)
    empty_groups = ", ".join("''" for _group in CHILD_GROUPS)
    op.execute(
        "CREATE TRIGGER incidentsearch_incident_ai AFTER INSERT ON incident BEGIN "
        f"INSERT INTO incidentsearch (rowid, {', '.join(COLUMNS)}) "
        f"VALUES (NEW.id, {incident_values}, {empty_groups}); END"
    )
    assignments = ", ".join(f"{g} = {_incident_expr(g, 'sqlite', 'NEW')}" for g in INCIDENT_GROUPS)
    op.execute(
        "CREATE TRIGGER incidentsearch_incident_au AFTER UPDATE OF "
        f"{', '.join(SEARCH_INCIDENT_COLUMNS)} ON incident BEGIN "
        f"UPDATE incidentsearch SET {assignments} WHERE rowid = NEW.id; END"
    )
    op.execute(
        "CREATE TRIGGER incidentsearch_incident_ad AFTER DELETE ON incident BEGIN "
        "DELETE FROM incidentsearch WHERE rowid = OLD.id; END"
    )
    for group, (table, _expr) in CHILD_GROUPS.items():
        new_text = _child_expr(group, "NEW")
        op.execute(
            f"CREATE TRIGGER incidentsearch_{table}_ai AFTER INSERT ON {table} "
            "WHEN NEW.incident_id IS NOT NULL BEGIN "
            f"UPDATE incidentsearch SET {group} = CASE WHEN coalesce({group}, '') = '' "
            f"THEN {new_text} ELSE {group} || char(10) || {new_text} END "
            "WHERE rowid = NEW.incident_id; END"
        )
        op.execute(
            f"CREATE TRIGGER incidentsearch_{table}_au AFTER UPDATE ON {table} BEGIN "
            f"UPDATE incidentsearch SET {group} = {_aggregate(group, 'sqlite', 'OLD.incident_id')}"
            " WHERE rowid = OLD.incident_id; "
            f"UPDATE incidentsearch SET {group} = {_aggregate(group, 'sqlite', 'NEW.incident_id')}"
            " WHERE rowid = NEW.incident_id AND NEW.incident_id IS NOT OLD.incident_id; END"
        )
        op.execute(
            f"CREATE TRIGGER incidentsearch_{table}_ad AFTER DELETE ON {table} BEGIN "
            f"UPDATE incidentsearch SET {group} = {_aggregate(group, 'sqlite', 'OLD.incident_id')}"
            " WHERE rowid = OLD.incident_id; END"
        )

    _signature_table()
    op.execute(
        "CREATE TRIGGER incidentsignature_incident_ai AFTER INSERT ON incident BEGIN "
        "INSERT INTO incidentsignature (incident_id) VALUES (NEW.id); END"
    )
    op.execute(
        "CREATE TRIGGER incidentsignature_incident_au AFTER UPDATE OF "
        f"{', '.join(SIGNATURE_INCIDENT_COLUMNS)} ON incident BEGIN "
        "UPDATE incidentsignature SET stale = 1 WHERE incident_id = NEW.id; END"
    )
    for table in SIGNATURE_CHILDREN:
        op.execute(
            f"CREATE TRIGGER incidentsignature_{table}_ai AFTER INSERT ON {table} BEGIN "
            "UPDATE incidentsignature SET stale = 1 WHERE incident_id = NEW.incident_id; END"
        )
        op.execute(
            f"CREATE TRIGGER incidentsignature_{table}_au AFTER UPDATE ON {table} BEGIN "
            "UPDATE incidentsignature SET stale = 1 "
            "WHERE incident_id IN (OLD.incident_id, NEW.incident_id); END"
        )
        op.execute(
            f"CREATE TRIGGER incidentsignature_{table}_ad AFTER DELETE ON {table} BEGIN "
            "UPDATE incidentsignature SET stale = 1 WHERE incident_id = OLD.incident_id; END"
        )


def _sqlite_downgrade() -> None:
    for table in SIGNATURE_CHILDREN:
        for suffix in ("ai", "au", "ad"):
            op.execute(f"DROP TRIGGER IF EXISTS incidentsignature_{table}_{suffix}")
    for suffix in ("ai", "au"):
        op.execute(f"DROP TRIGGER IF EXISTS incidentsignature_incident_{suffix}")
    op.drop_index("ix_incidentsignature_stale", table_name="incidentsignature")
    op.drop_table("incidentsignature")
    for table in ["incident", *(t for t, _e in CHILD_GROUPS.values())]:
        for suffix in ("ai", "au", "ad"):
            op.execute(f"DROP TRIGGER IF EXISTS incidentsearch_{table}_{suffix}")
    op.execute("DROP TABLE IF EXISTS incidentsearch")


# ------------------------------------------------------------------------- PostgreSQL

# First statement of every PostgreSQL child-table trigger: lock the affected incident
# rows (FOR NO KEY UPDATE, which foreign-key checks' KEY SHARE locks do not block), in id
# order. Writers of one incident's rows then queue on the incident and take the search and
# signature rows in one order (incident, incidentsearch, incidentsignature: triggers
# fire in name order), so concurrent writers cannot deadlock on those rows.
# kb.repo.store.next_evidence_key takes the same incident lock before numbering evidence.
PG_LOCK_INCIDENTS = (
    "IF TG_OP = 'INSERT' THEN "
    "PERFORM 1 FROM incident WHERE id = NEW.incident_id FOR NO KEY UPDATE; "
    "ELSIF TG_OP = 'DELETE' THEN "
    "PERFORM 1 FROM incident WHERE id = OLD.incident_id FOR NO KEY UPDATE; "
    "ELSE "
    "PERFORM 1 FROM incident WHERE id IN (OLD.incident_id, NEW.incident_id) ORDER BY id "
    "FOR NO KEY UPDATE; "
    "END IF; "
)


def _pg_upgrade() -> None:
    document = " || ".join(
        f"setweight(to_tsvector('english'::regconfig, left({group}, {cap})), '{weight}')"
        for group, (weight, cap) in PG_WEIGHTS.items()
    )
    text_columns = ", ".join(f"{c} text NOT NULL DEFAULT ''" for c in COLUMNS)
    op.execute(
        "CREATE TABLE incidentsearch ("
        "incident_id integer PRIMARY KEY REFERENCES incident (id) ON DELETE CASCADE, "
        f"{text_columns}, "
        f"document tsvector GENERATED ALWAYS AS ({document}) STORED)"
    )
    values = ", ".join(
        [_incident_expr(g, "postgresql", "i") for g in INCIDENT_GROUPS]
        + [_aggregate(g, "postgresql", "i.id") for g in CHILD_GROUPS]
    )
    op.execute(
        f"INSERT INTO incidentsearch (incident_id, {', '.join(INCIDENT_GROUPS)}, "
        f"{', '.join(CHILD_GROUPS)}) SELECT i.id, {values} FROM incident i"
    )
    op.execute("CREATE INDEX ix_incidentsearch_document ON incidentsearch USING gin (document)")

    incident_values = ", ".join(_incident_expr(g, "postgresql", "NEW") for g in INCIDENT_GROUPS)
    assignments = ", ".join(
        f"{g} = {_incident_expr(g, 'postgresql', 'NEW')}" for g in INCIDENT_GROUPS
    )
    op.execute(
        "CREATE FUNCTION incidentsearch_incident() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        "IF TG_OP = 'INSERT' THEN "
        f"INSERT INTO incidentsearch (incident_id, {', '.join(INCIDENT_GROUPS)}) "
        f"VALUES (NEW.id, {incident_values}); "
        "ELSE "
        f"UPDATE incidentsearch SET {assignments} WHERE incident_id = NEW.id; "
        "END IF; RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER incidentsearch_incident AFTER INSERT OR UPDATE OF "
        f"{', '.join(SEARCH_INCIDENT_COLUMNS)} ON incident "
        "FOR EACH ROW EXECUTE FUNCTION incidentsearch_incident()"
    )
    for group, (table, _expr) in CHILD_GROUPS.items():
        new_text = _child_expr(group, "NEW")
        # Insert appends; update and delete recompute the group from the base table. The
        # incident lock taken first makes the recompute read after any concurrent writer
        # of this incident committed (each statement in a plpgsql function takes a fresh
        # snapshot), and gives every writer the same lock order.
        op.execute(
            f"CREATE FUNCTION incidentsearch_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN "
            f"{PG_LOCK_INCIDENTS}"
            "IF TG_OP = 'INSERT' THEN "
            "IF NEW.incident_id IS NOT NULL THEN "
            f"UPDATE incidentsearch SET {group} = CASE WHEN {group} = '' THEN {new_text} "
            f"ELSE {group} || E'\\n' || {new_text} END WHERE incident_id = NEW.incident_id; "
            "END IF; "
            "RETURN NULL; "
            "END IF; "
            f"UPDATE incidentsearch SET {group} = "
            f"{_aggregate(group, 'postgresql', 'OLD.incident_id')} "
            "WHERE incident_id = OLD.incident_id; "
            "IF TG_OP = 'UPDATE' AND NEW.incident_id IS DISTINCT FROM OLD.incident_id THEN "
            f"UPDATE incidentsearch SET {group} = "
            f"{_aggregate(group, 'postgresql', 'NEW.incident_id')} "
            "WHERE incident_id = NEW.incident_id; "
            "END IF; "
            "RETURN NULL; END $$"
        )
        op.execute(
            f"CREATE TRIGGER incidentsearch_{table} AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION incidentsearch_{table}()"
        )

    _signature_table()
    op.execute(
        "CREATE FUNCTION incidentsignature_incident() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        "IF TG_OP = 'INSERT' THEN "
        "INSERT INTO incidentsignature (incident_id) VALUES (NEW.id); "
        "ELSE "
        "UPDATE incidentsignature SET stale = true WHERE incident_id = NEW.id; "
        "END IF; RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER incidentsignature_incident AFTER INSERT OR UPDATE OF "
        f"{', '.join(SIGNATURE_INCIDENT_COLUMNS)} ON incident "
        "FOR EACH ROW EXECUTE FUNCTION incidentsignature_incident()"
    )
    # Always an unconditional UPDATE (never `AND NOT stale`): it waits for a concurrent
    # kb.repo.family.refresh_signatures holding the row, so a refresh that read the old rows
    # cannot leave the signature marked fresh.
    op.execute(
        "CREATE FUNCTION incidentsignature_child() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        f"{PG_LOCK_INCIDENTS}"
        "IF TG_OP IN ('UPDATE', 'DELETE') THEN "
        "UPDATE incidentsignature SET stale = true WHERE incident_id = OLD.incident_id; "
        "END IF; "
        "IF TG_OP IN ('INSERT', 'UPDATE') THEN "
        "UPDATE incidentsignature SET stale = true WHERE incident_id = NEW.incident_id; "
        "END IF; "
        "RETURN NULL; END $$"
    )
    for table in SIGNATURE_CHILDREN:
        op.execute(
            f"CREATE TRIGGER incidentsignature_{table} AFTER INSERT OR UPDATE OR DELETE "
            f"ON {table} FOR EACH ROW EXECUTE FUNCTION incidentsignature_child()"
        )


def _pg_downgrade() -> None:
    for table in SIGNATURE_CHILDREN:
        op.execute(f"DROP TRIGGER IF EXISTS incidentsignature_{table} ON {table}")
    op.execute("DROP TRIGGER IF EXISTS incidentsignature_incident ON incident")
    op.execute("DROP FUNCTION IF EXISTS incidentsignature_child()")
    op.execute("DROP FUNCTION IF EXISTS incidentsignature_incident()")
    op.drop_index("ix_incidentsignature_stale", table_name="incidentsignature")
    op.drop_table("incidentsignature")
    for table in ["incident", *(t for t, _e in CHILD_GROUPS.values())]:
        op.execute(f"DROP TRIGGER IF EXISTS incidentsearch_{table} ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS incidentsearch_{table}()")
    op.execute("DROP TABLE IF EXISTS incidentsearch")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_upgrade()
    else:
        _pg_upgrade()


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_downgrade()
    else:
        _pg_downgrade()
