"""Errors that only the store raises."""

from __future__ import annotations

from app.core.errors import Unprocessable


class ValueTooLarge(Unprocessable):
    code = "value_too_large"


class VectorDimsMismatch(Unprocessable):
    code = "vector_dims_mismatch"


class TooManyVectors(Unprocessable):
    code = "too_many_vectors"
