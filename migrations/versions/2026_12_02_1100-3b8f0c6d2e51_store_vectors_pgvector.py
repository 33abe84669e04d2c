"""the store's vectors as pgvector values, where the `vector` extension exists

Revision ID: 3b8f0c6d2e51
Revises: d41c8e2f7a16
Create Date: 2026-12-02 11:00:00+00:00

A no-op on SQLite and on a Postgres without pgvector (`vector` absent from
`pg_available_extensions`, or not ours to create): the store's exact search serves them.

Where it exists, `store_vectors` gains `embedding_vec`, the float32 little-endian bytes of
`embedding` as a `vector`, a stored generated column: every writer (the store, an import,
a bench's SQL load) gets it without knowing pgvector, and it can never disagree with the
bytes. `agentstate_f32_vector` decodes the bytes in SQL (sign, exponent and mantissa of each
component: exact, since float32 components in double precision are); the store's writes
refuse infinities and NaN, so none is decoded. No HNSW index is created here: they are per
index name, dimension and metric, built when a search needs one (app/store/pgvector.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3b8f0c6d2e51"
down_revision: str | Sequence[str] | None = "d41c8e2f7a16"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECODE = """
CREATE OR REPLACE FUNCTION agentstate_f32_vector(b bytea) RETURNS vector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT array_agg(
    (CASE WHEN s = 1 THEN -1.0::float8 ELSE 1.0::float8 END)
    * (CASE WHEN e = 0 THEN m::float8 * power(2::float8, -149)
            ELSE (1.0::float8 + m::float8 / 8388608.0::float8) * power(2::float8, e - 127)
       END) ORDER BY i)::real[]::vector
  FROM (SELECT i,
               get_byte(b, 4 * i + 3) >> 7 AS s,
               ((get_byte(b, 4 * i + 3) & 127) << 1) | (get_byte(b, 4 * i + 2) >> 7) AS e,
               ((get_byte(b, 4 * i + 2) & 127) << 16) | (get_byte(b, 4 * i + 1) << 8)
                 | get_byte(b, 4 * i) AS m
        FROM generate_series(0, length(b) / 4 - 1) AS i) AS components
$$
"""


def _has_pgvector(bind: sa.Connection) -> bool:
    """The extension is installed, or available and ours to create (a savepoint: a refusal
    leaves the migration's transaction usable)."""
    if bind.scalar(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'vector'")):
        return True
    if not bind.scalar(sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")):
        return False
    try:
        with bind.begin_nested():
            bind.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
    except sa.exc.DBAPIError:
        return False
    return True


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or not _has_pgvector(bind):
        return
    op.execute(DECODE)
    op.execute("ALTER TABLE store_vectors ADD COLUMN embedding_vec vector "
               "GENERATED ALWAYS AS (agentstate_f32_vector(embedding)) STORED")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # The HNSW indexes are on the column: they go with it.
    op.execute("ALTER TABLE store_vectors DROP COLUMN IF EXISTS embedding_vec")
    op.execute("DROP FUNCTION IF EXISTS agentstate_f32_vector(bytea)")
