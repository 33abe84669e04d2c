"""Exact vector scoring: the embeddings of a search's candidates against its query vector.

Embeddings are stored as float32 little-endian bytes on every backend; numpy scores a chunk
of them in one matrix product, and `Ranking` keeps the best items. Where Postgres has
pgvector, SQL finds the nearest vectors first (exact, or HNSW on a large index:
app/store/pgvector.py) and only theirs are scored here, so every backend answers the same
scores. Scores are higher-is-better: cosine similarity, the inner product, or minus the Euclidean
distance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.core.errors import Unprocessable

FLOAT32_MAX = float(np.finfo(np.float32).max)


def pack(embedding: Sequence[float], pointer: str) -> bytes:
    values = np.asarray(embedding, dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(np.abs(values) > FLOAT32_MAX):
        raise Unprocessable(f"{pointer}: vector components must be finite float32 numbers.",
                            errors=[{"pointer": pointer, "code": "vector_out_of_range",
                                     "message": "not a finite float32"}])
    return values.astype("<f4").tobytes()


def unpack(embedding: bytes) -> list[float]:
    return [float(x) for x in np.frombuffer(embedding, dtype="<f4")]


def scores(blob: bytes, query: Sequence[float], metric: str) -> np.ndarray:
    """The scores of the embeddings in `blob` (end to end), in order."""
    q = np.asarray(query, dtype=np.float64)
    m = np.frombuffer(blob, dtype="<f4").reshape(-1, len(q)).astype(np.float64)
    if metric == "inner_product":
        return m @ q
    if metric == "l2":
        return -np.linalg.norm(m - q, axis=1)  # type: ignore[no-any-return]
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    out = np.zeros(len(m))
    np.divide(m @ q, norms, out=out, where=norms != 0)
    return out


class Ranking:
    """The scores of a search's candidates, a chunk at a time; an item's score is its best
    vector's. `best(n)` is the top n items, best first (ties: the newer id first), in one
    pass of numpy over every candidate (no Python loop per vector, no full sort)."""

    def __init__(self) -> None:
        self._ids: list[np.ndarray] = []
        self._scores: list[np.ndarray] = []

    def add(self, ids: Sequence[int], chunk_scores: np.ndarray) -> None:
        self._ids.append(np.asarray(ids, dtype=np.int64))
        self._scores.append(chunk_scores)

    def best(self, n: int) -> tuple[list[int], dict[int, float], int]:
        """(the top n item ids in order, their scores, how many items were scored)."""
        if not self._ids:
            return [], {}, 0
        ids = np.concatenate(self._ids)
        values = np.concatenate(self._scores)
        grouped = np.lexsort((-values, ids))  # by item, its best score first
        ids, values = ids[grouped], values[grouped]
        first = np.ones(len(ids), dtype=bool)
        first[1:] = ids[1:] != ids[:-1]
        ids, values = ids[first], values[first]
        if n < len(ids):  # every item scoring at least the n-th best, ties included
            threshold = np.partition(values, len(values) - n)[len(values) - n]
            keep = values >= threshold
            top_ids, top_values = ids[keep], values[keep]
        else:
            top_ids, top_values = ids, values
        order = np.lexsort((-top_ids, -top_values))[:n]
        chosen = [int(i) for i in top_ids[order]]
        return chosen, dict(zip(chosen, (float(v) for v in top_values[order]), strict=True)), \
            len(ids)
