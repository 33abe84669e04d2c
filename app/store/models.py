"""The store (API.md section 7b): items a namespace and a key address, with their vectors.

An item is one row per (tenant, namespace, key), upserted; a DELETE leaves a tombstone, so a
re-created item continues its revision sequence and an ETag is never reused for the same
address. An item whose `expires_at` has passed reads as a tombstone until the sweeper blanks
it (app/retention). `namespace` and `key` are stored as they travel in URLs: each label
encoded as a name (`app/store/addressing.py`), the labels joined by `/`.

Lexical search reads `search_text`: the text at the item's index fields, tokenised by the
server. Postgres serves it with a stored generated tsvector `search_tsv` and its GIN index
(`ix_store_items_search_tsv_gin`), SQLite with the FTS5 table `store_items_fts` the migration
keeps in step by triggers; neither can be declared here (app/db/migrate.py `include_name`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, SortedName, UTCDateTime

# Labels encoded and joined by "/": at most MAX_NAMESPACE_CHARS (app/store/addressing.py).
NamespacePath = String(512).with_variant(String(512, collation="C"), "postgresql")


class StoreItem(Base):
    __tablename__ = "store_items"
    __table_args__ = (
        # Also the order of a prefix's namespaces (a range on `namespace`).
        UniqueConstraint("tenant_id", "namespace", "key"),
        # Search without a query pages by recency: the index gives the whole order (items
        # written in one instant, an import, are not sorted again after it).
        Index("ix_store_items_tenant_id_updated_at_id", "tenant_id", "updated_at", "id"),
        # ... and so within one namespace (app/store/repository.py `recent`).
        Index("ix_store_items_tenant_id_namespace_updated_at_id", "tenant_id", "namespace",
              "updated_at", "id"),
        # The sweeper finds expired items by it.
        Index("ix_store_items_expires_at", "expires_at",
              postgresql_where=text("expires_at IS NOT NULL AND deleted_at IS NULL"),
              sqlite_where=text("expires_at IS NOT NULL AND deleted_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    namespace: Mapped[str] = mapped_column(NamespacePath)
    key: Mapped[str] = mapped_column(SortedName)
    revision: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # The JSON paths lexical search reads (`null`: the whole value; `[]`: none).
    index_fields: Mapped[list[str] | None] = mapped_column(JSONType, nullable=True)
    search_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The time to live in milliseconds (the API speaks seconds, fractions allowed).
    ttl_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class StoreVector(Base):
    """One caller-computed embedding of one field of an item, in one named vector index:
    float32, little-endian, on every backend (so it travels as it is).

    Indexes of different dimensions live side by side (a new embedding model is a new index
    name); within a tenant an index name holds one dimension. A vector names its item by
    address, as an export does; it goes with its item's content: replaced by a PUT, removed
    by a DELETE or an expiry.
    """

    __tablename__ = "store_vectors"
    __table_args__ = (
        UniqueConstraint("tenant_id", "namespace", "key", "index_name", "field"),
        # An index's dimension is looked up by name.
        Index("ix_store_vectors_tenant_id_index_name_dims", "tenant_id", "index_name", "dims"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    namespace: Mapped[str] = mapped_column(NamespacePath)
    key: Mapped[str] = mapped_column(SortedName)
    index_name: Mapped[str] = mapped_column(String(255))
    field: Mapped[str] = mapped_column(String(255))
    dims: Mapped[int] = mapped_column(Integer)
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
