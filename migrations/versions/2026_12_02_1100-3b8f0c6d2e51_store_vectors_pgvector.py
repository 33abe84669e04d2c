"""the store's vectors as pgvector values, where the `vector` extension exists

Revision ID: 3b8f0c6d2e51
Revises: d41c8e2f7a16
Create Date: 2026-12-02 11:00:00+00:00

A no-op on SQLite and on a Postgres without pgvector (`vector` absent from
`pg_available_extensions`, or not ours to create): the store's exact search serves them.

Where it exists, `store_vectors` gains `embedding_vec`, the float32 little-endian bytes of
`embedding` as a `vector`, a stored generated column: every writer (the store, an import,
a bench's SQL load) gets it without knowing pgvector, and it can never disagree with the
bytes. `agentstate_f32_vector` decodes the bytes in PL/pgSQL (sign, exponent and mantissa of
each component: exact, subnormals included, since a float32 is exact in double precision);
the store's writes refuse infinities and NaN, so none is decoded. It costs about 1 us a
component on this machine (0.1 ms a 128-d vector, 1.9 ms a 1,536-d one), on every write of a
vector; PL/pgSQL with a preallocated array was 2-3x faster than one SQL statement. No HNSW index is created here: they are per
index name, dimension and metric, built when a search needs one (app/store/pgvector.py).

Applied where pgvector was missing, and pgvector installed later: `agentstate migrate` runs
`upgrade()` again (`upgrade_again`, app/db/migrate.py).
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
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
  n int := length(b) / 4;
  components real[] := array_fill(0::real, ARRAY[n]);
  hi int;
  e int;
  m int;
BEGIN
  FOR i IN 0 .. n - 1 LOOP
    hi := get_byte(b, 4 * i + 3);
    e := ((hi & 127) << 1) | (get_byte(b, 4 * i + 2) >> 7);
    m := ((get_byte(b, 4 * i + 2) & 127) << 16) | (get_byte(b, 4 * i + 1) << 8)
         | get_byte(b, 4 * i);
    components[i + 1] := (CASE WHEN hi >= 128 THEN -1 ELSE 1 END)
      * (CASE WHEN e = 0 THEN m * 2.0::float8 ^ -149
              ELSE (8388608 + m) * 2.0::float8 ^ (e - 150) END);
  END LOOP;
  RETURN components::vector;
END
$$
"""


def _has_column(bind: sa.Connection) -> bool:
    return bool(bind.scalar(sa.text(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('store_vectors') "
        "AND attname = 'embedding_vec' AND NOT attisdropped")))


def upgrade_again(bind: sa.Connection) -> bool:
    """Whether `upgrade()` would now add what it could not when it ran: pgvector installed
    (or made creatable) after this revision was applied without it. `agentstate migrate`
    asks on every run (app/db/migrate.py)."""
    return bind.dialect.name == "postgresql" and not _has_column(bind) and _has_pgvector(bind)


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
