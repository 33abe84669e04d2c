"""per-tenant event feed without a per-tenant write lock; thread ttl

Events get a table-wide `id` (the old global `seq`) and a per-tenant `seq` assigned by the
sequencer (NULL until then). Existing
events are numbered 1, 2, ... per tenant in their old order. Threads get `ttl_seconds`.
See docs/events.md.

Revision ID: 7394f9ae97e4
Revises: 9772f0f32351
Create Date: 2026-11-30 12:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7394f9ae97e4"
down_revision: str | Sequence[str] | None = "9772f0f32351"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)

# The sequencer (docs/events.md). One call is one short transaction of its own (the caller
# runs it in autocommit): it takes the tenant's sequencing lock, numbers the tenant's
# committed events that have no seq yet after the tenant's newest seq, and notifies
# listeners. Writers never take this lock. In a VOLATILE PL/pgSQL function every statement
# takes a fresh snapshot under READ COMMITTED, so `head` and the UPDATE see every commit made
# before the lock was granted, the previous sequencer's included.
SEQUENCER = """
CREATE FUNCTION agentstate_sequence_events(p_tenant text, p_limit integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    head bigint;
    numbered bigint;
BEGIN
    -- Nothing to number: no lock. Safe, as a row numbered by a sequencer that has not
    -- committed yet still reads as unnumbered here, which takes the slow path and waits.
    IF NOT EXISTS (SELECT 1 FROM events WHERE tenant_id = p_tenant AND seq IS NULL) THEN
        RETURN (SELECT coalesce(max(seq), 0) FROM events WHERE tenant_id = p_tenant);
    END IF;
    PERFORM pg_advisory_xact_lock(1634169716, hashtext(p_tenant));
    SELECT coalesce(max(seq), 0) INTO head FROM events WHERE tenant_id = p_tenant;
    WITH ready AS (
        SELECT id, row_number() OVER (ORDER BY id) AS n
        FROM (SELECT id FROM events WHERE tenant_id = p_tenant AND seq IS NULL
              ORDER BY id LIMIT p_limit) AS batch
    )
    UPDATE events SET seq = head + ready.n FROM ready WHERE events.id = ready.id;
    GET DIAGNOSTICS numbered = ROW_COUNT;
    IF numbered > 0 THEN
        PERFORM pg_notify('agentstate_events', p_tenant);
    END IF;
    RETURN head + numbered;
END $$
"""


def _event_indexes() -> None:
    op.create_index("ix_events_tenant_id_thread_id_seq", "events",
                    ["tenant_id", "thread_id", "seq"])
    op.create_index("ix_events_unsequenced", "events", ["tenant_id", "id"],
                    postgresql_where=sa.text("seq IS NULL"), sqlite_where=sa.text("seq IS NULL"))
    op.create_index("ix_events_at", "events", ["at"])


def upgrade() -> None:
    op.add_column("threads", sa.Column("ttl_seconds", sa.BigInteger(), nullable=True))
    op.create_index("ix_threads_expiring", "threads", ["updated_at"],
                    postgresql_where=sa.text("ttl_seconds IS NOT NULL AND deleted_at IS NULL"),
                    sqlite_where=sa.text("ttl_seconds IS NOT NULL AND deleted_at IS NULL"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE events RENAME COLUMN seq TO id")
        op.execute("ALTER SEQUENCE IF EXISTS events_seq_seq RENAME TO events_id_seq")
        op.drop_index("ix_events_tenant_id_thread_id_seq", table_name="events")
        op.drop_index("ix_events_tenant_id_seq", table_name="events")
        op.add_column("events", sa.Column("seq", sa.BigInteger(), nullable=True))
        op.execute("UPDATE events SET seq = r.n FROM (SELECT id, row_number() OVER "
                   "(PARTITION BY tenant_id ORDER BY id) AS n FROM events) AS r "
                   "WHERE events.id = r.id")
        op.create_unique_constraint("uq_events_tenant_id_seq", "events", ["tenant_id", "seq"])
        _event_indexes()
        op.execute(SEQUENCER)
        return
    op.create_table(
        "events_new",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("thread_id", sa.String(length=255), nullable=True),
        sa.Column("resource", sa.String(length=1024), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=True),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.UniqueConstraint("tenant_id", "seq", name="uq_events_tenant_id_seq"),
        sqlite_autoincrement=True,
    )
    op.execute("INSERT INTO events_new (id, tenant_id, seq, at, type, thread_id, resource, "
               "revision, actor) SELECT seq, tenant_id, row_number() OVER (PARTITION BY "
               "tenant_id ORDER BY seq), at, type, thread_id, resource, revision, actor "
               "FROM events")
    op.drop_table("events")
    op.rename_table("events_new", "events")
    _event_indexes()


def downgrade() -> None:
    op.drop_index("ix_threads_expiring", table_name="threads")
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("ttl_seconds")
    for name in ("ix_events_at", "ix_events_unsequenced", "ix_events_tenant_id_thread_id_seq"):
        op.drop_index(name, table_name="events")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION agentstate_sequence_events(text, integer)")
        op.drop_constraint("uq_events_tenant_id_seq", "events", type_="unique")
        op.drop_column("events", "seq")
        op.execute("ALTER TABLE events RENAME COLUMN id TO seq")
        op.execute("ALTER SEQUENCE IF EXISTS events_id_seq RENAME TO events_seq_seq")
    else:
        op.create_table(
            "events_old",
            sa.Column("seq", BigIntPK, autoincrement=True, nullable=False),
            sa.Column("tenant_id", sa.String(length=255), nullable=False),
            sa.Column("at", Timestamp, nullable=False),
            sa.Column("type", sa.String(length=64), nullable=False),
            sa.Column("thread_id", sa.String(length=255), nullable=True),
            sa.Column("resource", sa.String(length=1024), nullable=False),
            sa.Column("revision", sa.BigInteger(), nullable=True),
            sa.Column("actor", sa.String(length=255), nullable=False),
            sa.PrimaryKeyConstraint("seq", name="pk_events"),
            sqlite_autoincrement=True,
        )
        op.execute("INSERT INTO events_old (seq, tenant_id, at, type, thread_id, resource, "
                   "revision, actor) SELECT id, tenant_id, at, type, thread_id, resource, "
                   "revision, actor FROM events")
        op.drop_table("events")
        op.rename_table("events_old", "events")
    op.create_index("ix_events_tenant_id_seq", "events", ["tenant_id", "seq"])
    op.create_index("ix_events_tenant_id_thread_id_seq", "events",
                    ["tenant_id", "thread_id", "seq"])
