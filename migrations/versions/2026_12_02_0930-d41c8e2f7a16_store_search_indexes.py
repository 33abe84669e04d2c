"""the store's search indexes: a stored tsvector, GIN indexes without a pending list

Revision ID: d41c8e2f7a16
Revises: 9e749a62aea0
Create Date: 2026-12-02 09:30:00+00:00

Search without a query orders by (updated_at, id): the recency index gains `id`, so it gives
that order whole. Without it Postgres walked the index backwards and sorted each run of equal
`updated_at` (items written in one instant: an import, a bench's load) before the LIMIT,
filtering every item of the run: 170-250 ms for a filtered search at 100,000 items. And
within one namespace, `(tenant_id, namespace, updated_at, id)`: a search under a prefix walks
its namespace alone (app/store/repository.py `recent`), not the tenant's newer items too.

Then Postgres only (SQLite's lexical search reads FTS5 already). Lexical search ranked every
matching item with `to_tsvector` computed again per row (the GIN expression index finds the
rows, but `ts_rank` needs the vector): a stored generated column `search_tsv` holds it, GIN
indexed. The GIN indexes lose `fastupdate`: with it, every search scans the index's pending
list of recent writes (up to `gin_pending_list_limit`, 4 MB) as well as the index, which is
most of a filtered search's time after a burst of writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "d41c8e2f7a16"
down_revision: str | Sequence[str] | None = "9e749a62aea0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TSVECTOR = "to_tsvector('simple'::regconfig, coalesce(search_text, ''))"


def upgrade() -> None:
    op.create_index("ix_store_items_tenant_id_updated_at_id", "store_items",
                    ["tenant_id", "updated_at", "id"])
    op.drop_index("ix_store_items_tenant_id_updated_at", table_name="store_items")
    op.create_index("ix_store_items_tenant_id_namespace_updated_at_id", "store_items",
                    ["tenant_id", "namespace", "updated_at", "id"])
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE store_items ADD COLUMN search_tsv tsvector "
               f"GENERATED ALWAYS AS ({TSVECTOR}) STORED")
    op.execute("CREATE INDEX ix_store_items_search_tsv_gin ON store_items USING gin "
               "(search_tsv) WITH (fastupdate = off)")
    op.execute("DROP INDEX ix_store_items_search_text_gin")
    op.execute("ALTER INDEX ix_store_items_value_gin SET (fastupdate = off)")
    op.execute("SELECT gin_clean_pending_list('ix_store_items_value_gin'::regclass)")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER INDEX ix_store_items_value_gin RESET (fastupdate)")
        op.execute("CREATE INDEX ix_store_items_search_text_gin ON store_items USING gin "
                   f"({TSVECTOR})")
        op.execute("DROP INDEX ix_store_items_search_tsv_gin")
        op.execute("ALTER TABLE store_items DROP COLUMN search_tsv")
    op.create_index("ix_store_items_tenant_id_updated_at", "store_items",
                    ["tenant_id", "updated_at"])
    op.drop_index("ix_store_items_tenant_id_namespace_updated_at_id", table_name="store_items")
    op.drop_index("ix_store_items_tenant_id_updated_at_id", table_name="store_items")
