from __future__ import annotations

from fastapi import Response

from app.batch.schemas import BatchIn, BatchOut
from app.batch.service import BatchService
from app.http.dependencies import Writer
from app.http.idempotency import IdempotencyDep, replayable
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(prefix="/v1/batch", tags=["batch"])


@router.post("", response_model=BatchOut, responses=responses(404, 409, 410, 412, 428),
             summary="Apply up to 100 operations in one transaction, all or nothing")
async def run_batch(body: BatchIn, uow: Writer,
                    idempotency: IdempotencyDep) -> Response:
    """Thread put/patch/delete, message append/remove and agent-state put/patch/delete, each
    with its own `if_match` / `if_none_match` (the single request's headers), in order. 200
    with each operation's result; when one is refused, the answer is its problem (status,
    code, ...) with `operation` (its index) and nothing of the batch is written.
    `Idempotency-Key` as on appends, scoped to the first operation's thread."""
    out, replayed = await BatchService(uow).run(body, idempotency)
    return replayable(out, replayed)
