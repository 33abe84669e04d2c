from __future__ import annotations

from fastapi import Request, Response

from app.compactions.schemas import CompactionDetail, CompactionIn, CompactionOut
from app.compactions.service import CompactionService, compaction_path
from app.core.pagination import Page
from app.http.dependencies import IfMatchWriter, Reader
from app.http.idempotency import IdempotencyDep, created
from app.http.pagination import Cursor, Limit, linked
from app.http.params import CompactionId, ThreadId
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(prefix="/v1/threads/{thread_id}/compactions", tags=["compactions"])


@router.post("", status_code=201, response_model=CompactionOut,
             responses=responses(404, 409, 410, 412), summary="Compact a run of messages")
async def create_compaction(
    thread_id: ThreadId, body: CompactionIn, uow: IfMatchWriter, idempotency: IdempotencyDep,
) -> Response:
    """Replaces a contiguous run of live messages with a summary, in one transaction and one
    thread revision. 422 `compaction_not_contiguous`, `message_not_live`, `message_not_found`;
    409 `message_exists` (the summary's id), `idempotency_in_flight`."""
    out, replayed = await CompactionService(uow).create(
        thread_id, body, uow.preconditions, idempotency
    )
    return created(out, replayed, {"Location": compaction_path(thread_id, out["id"])})


@router.get("", responses=responses(404), summary="List a thread's compactions, oldest first")
async def list_compactions(
    thread_id: ThreadId, request: Request, response: Response, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
) -> Page[CompactionOut]:
    page = await CompactionService(uow).list(thread_id, limit=limit, cursor=cursor)
    return linked(request, response, page)


@router.get("/{compaction_id}", responses=responses(404),
            summary="Get a compaction and the messages it replaced")
async def get_compaction(thread_id: ThreadId, compaction_id: CompactionId,
                         uow: Reader) -> CompactionDetail:
    return await CompactionService(uow).get(thread_id, compaction_id)


@router.delete("/{compaction_id}", status_code=204,
               responses=responses(404, 409, 410, 412), summary="Revert a compaction")
async def revert_compaction(thread_id: ThreadId, compaction_id: CompactionId,
                            uow: IfMatchWriter) -> Response:
    """The sources are live again, the summary becomes `reverted`, the record leaves the
    list. 409 `compaction_covered` while a later compaction covers the summary."""
    await CompactionService(uow).revert(thread_id, compaction_id, uow.preconditions)
    return Response(status_code=204)
