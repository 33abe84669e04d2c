"""the store: items by namespace and key, their vectors; idempotency keys of the tenant

Revision ID: b5d1e7a3c902
Revises: 6c2f0a9d4e71
Create Date: 2026-12-01 10:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b5d1e7a3c902"
down_revision: str | Sequence[str] | None = "6c2f0a9d4e71"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)
SortedName = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")
NamespacePath = sa.String(length=512).with_variant(sa.String(length=512, collation="C"),
                                                   "postgresql")
LIVE_WITH_EXPIRY = sa.text("expires_at IS NOT NULL AND deleted_at IS NULL")

# SQLite: lexical search reads an FTS5 table over `search_text`, kept in step by triggers
# (external content: the text stays in store_items; the 'delete' command needs the old text).
SQLITE_FTS = [
    ("CREATE VIRTUAL TABLE store_items_fts USING fts5(search_text, content='store_items', "
     "content_rowid='id', tokenize='unicode61 remove_diacritics 0')"),
    ("CREATE TRIGGER store_items_fts_insert AFTER INSERT ON store_items "
     "WHEN new.search_text IS NOT NULL BEGIN "
     "INSERT INTO store_items_fts(rowid, search_text) VALUES (new.id, new.search_text); END"),
    ("CREATE TRIGGER store_items_fts_delete AFTER DELETE ON store_items "
     "WHEN old.search_text IS NOT NULL BEGIN "
     "INSERT INTO store_items_fts(store_items_fts, rowid, search_text) "
     "VALUES ('delete', old.id, old.search_text); END"),
    ("CREATE TRIGGER store_items_fts_update AFTER UPDATE OF search_text ON store_items BEGIN "
     "INSERT INTO store_items_fts(store_items_fts, rowid, search_text) "
     "SELECT 'delete', old.id, old.search_text WHERE old.search_text IS NOT NULL; "
     "INSERT INTO store_items_fts(rowid, search_text) "
     "SELECT new.id, new.search_text WHERE new.search_text IS NOT NULL; END"),
]
# Postgres: full-text search over the same tokens, and containment over the value (filters).
POSTGRES_GIN = [
    ("CREATE INDEX ix_store_items_search_text_gin ON store_items USING gin "
     "(to_tsvector('simple'::regconfig, coalesce(search_text, '')))"),
    ("CREATE INDEX ix_store_items_value_gin ON store_items USING gin "
     "((value::jsonb) jsonb_path_ops)"),
]


def upgrade() -> None:
    op.create_table(
        "store_items",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("namespace", NamespacePath, nullable=False),
        sa.Column("key", SortedName, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("index_fields", sa.JSON(), nullable=True),
        sa.Column("search_text", sa.Text(), nullable=True),
        sa.Column("ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("expires_at", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("deleted_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_items")),
        sa.UniqueConstraint("tenant_id", "namespace", "key",
                            name=op.f("uq_store_items_tenant_id_namespace_key")),
    )
    op.create_index("ix_store_items_tenant_id_updated_at", "store_items",
                    ["tenant_id", "updated_at"])
    op.create_index("ix_store_items_expires_at", "store_items", ["expires_at"],
                    postgresql_where=LIVE_WITH_EXPIRY, sqlite_where=LIVE_WITH_EXPIRY)
    op.create_table(
        "store_vectors",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("namespace", NamespacePath, nullable=False),
        sa.Column("key", SortedName, nullable=False),
        sa.Column("index_name", sa.String(length=255), nullable=False),
        sa.Column("field", sa.String(length=255), nullable=False),
        sa.Column("dims", sa.Integer(), nullable=False),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_vectors")),
        sa.UniqueConstraint(
            "tenant_id", "namespace", "key", "index_name", "field",
            name=op.f("uq_store_vectors_tenant_id_namespace_key_index_name_field")),
    )
    op.create_index("ix_store_vectors_tenant_id_index_name_dims", "store_vectors",
                    ["tenant_id", "index_name", "dims"])
    op.create_table(
        "tenant_idempotency_keys",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenant_idempotency_keys")),
        sa.UniqueConstraint("tenant_id", "endpoint", "key",
                            name=op.f("uq_tenant_idempotency_keys_tenant_id_endpoint_key")),
    )
    op.create_index("ix_tenant_idempotency_keys_tenant_id_created_at",
                    "tenant_idempotency_keys", ["tenant_id", "created_at"])
    statements = SQLITE_FTS if op.get_context().dialect.name == "sqlite" else POSTGRES_GIN
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        for trigger in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER store_items_fts_{trigger}")
        op.execute("DROP TABLE store_items_fts")
    op.drop_index("ix_tenant_idempotency_keys_tenant_id_created_at",
                  table_name="tenant_idempotency_keys")
    op.drop_table("tenant_idempotency_keys")
    op.drop_index("ix_store_vectors_tenant_id_index_name_dims", table_name="store_vectors")
    op.drop_table("store_vectors")
    op.drop_index("ix_store_items_expires_at", table_name="store_items")
    op.drop_index("ix_store_items_tenant_id_updated_at", table_name="store_items")
    op.drop_table("store_items")
