"""Exact vector scoring: the embeddings of a search's candidates against its query vector.

Embeddings are stored as float32 little-endian bytes on every backend; numpy scores a chunk
of them in one matrix product (a vector index of pgvector, where there is one, is
`app/store/hnsw.py`). Scores are higher-is-better: cosine similarity, the inner product, or
minus the Euclidean distance.
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


def scores(blobs: Sequence[bytes], query: Sequence[float], metric: str) -> list[float]:
    q = np.asarray(query, dtype=np.float64)
    m = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), len(q)).astype(np.float64)
    if metric == "inner_product":
        return (m @ q).tolist()  # type: ignore[no-any-return]
    if metric == "l2":
        return (-np.linalg.norm(m - q, axis=1)).tolist()  # type: ignore[no-any-return]
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    out = np.zeros(len(blobs))
    np.divide(m @ q, norms, out=out, where=norms != 0)
    return list(out.tolist())
