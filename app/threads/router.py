from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Request, Response

from app.auth.dependencies import ReadAccess, WriteAccess
from app.core.conditional import Conditions, etag, not_modified
from app.core.limits import SettingsDep
from app.core.pagination import Cursor, Limit, Page, set_next_link
from app.core.problems import responses
from app.core.schemas import json_object_param, name_path
from app.db.session import ReadSession, WriteSession
from app.messages.service import MessageService
from app.threads.schemas import (
    ThreadCreate,
    ThreadOut,
    ThreadPatch,
    ThreadReplace,
    ThreadWithMessages,
)
from app.threads.service import ThreadService, thread_path

router = APIRouter(prefix="/v1/threads", tags=["threads"])

ThreadId = Annotated[str, name_path("Thread id")]
MERGE_PATCH = {"application/merge-patch+json": {"schema": {"$ref": "#/components/schemas/ThreadPatch"}}}


def _with_etag(response: Response, thread: ThreadOut) -> ThreadOut:
    response.headers["ETag"] = etag(thread.revision)
    return thread


@router.post("", status_code=201, responses=responses(409), summary="Create a thread")
async def create_thread(body: ThreadCreate, response: Response, session: WriteSession,
                        principal: WriteAccess, settings: SettingsDep) -> ThreadOut:
    thread = await ThreadService(session, principal, settings).create(body)
    response.headers["Location"] = thread_path(thread.thread_id)
    return _with_etag(response, thread)


@router.get("", responses=responses(), summary="List threads, newest first")
async def list_threads(
    request: Request, response: Response, session: ReadSession, principal: ReadAccess,
    settings: SettingsDep, limit: Limit = 20, cursor: Cursor = None,
    metadata: Annotated[str | None, Query(description="JSON object; containment (@>).")] = None,
    updated_after: Annotated[datetime | None, Query(description="RFC 3339 timestamp.")] = None,
) -> Page[ThreadOut]:
    data, next_cursor = await ThreadService(session, principal, settings).list(
        limit=limit, cursor=cursor, metadata=json_object_param("metadata", metadata),
        updated_after=updated_after,
    )
    set_next_link(request, response, next_cursor)
    return Page(data=data, next_cursor=next_cursor, has_more=next_cursor is not None)


@router.get("/{thread_id}", responses={**responses(404), 304: {"description": "Not Modified"}},
            response_model=ThreadWithMessages, response_model_exclude_unset=True,
            summary="Get a thread")
async def get_thread(
    thread_id: ThreadId, response: Response, session: ReadSession, principal: ReadAccess,
    settings: SettingsDep, if_none_match: Annotated[str | None, Header()] = None,
    include: Annotated[Literal["messages"] | None, Query(
        description="`messages`: add the first page of the live view as `messages`.")] = None,
    messages_limit: Annotated[int, Query(ge=1, le=1000, description="With include=messages: "
                                         "page size, 1-1000.")] = 100,
) -> ThreadOut:
    if include == "messages":
        thread = await MessageService(session, principal, settings).thread_with_messages(
            thread_id, messages_limit
        )
    else:
        thread = await ThreadService(session, principal, settings).get(thread_id)
    if not_modified(if_none_match, thread.revision):
        return Response(status_code=304, headers={"ETag": etag(thread.revision)})  # type: ignore[return-value]
    return _with_etag(response, thread)


@router.put("/{thread_id}", responses={**responses(409, 410, 412, 428), 201: {"model": ThreadOut}},
            summary="Create or replace a thread")
async def put_thread(thread_id: ThreadId, body: ThreadReplace, response: Response,
                     session: WriteSession, principal: WriteAccess, settings: SettingsDep,
                     pre: Conditions) -> ThreadOut:
    thread, created = await ThreadService(session, principal, settings).replace(
        thread_id, body, pre
    )
    if created:
        response.status_code = 201
        response.headers["Location"] = thread_path(thread_id)
    return _with_etag(response, thread)


@router.patch("/{thread_id}", responses=responses(404, 410, 412, 428),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch a thread (RFC 7396)")
async def patch_thread(thread_id: ThreadId, body: Annotated[ThreadPatch, Body()],
                       response: Response, session: WriteSession, principal: WriteAccess,
                       settings: SettingsDep, pre: Conditions) -> ThreadOut:
    thread = await ThreadService(session, principal, settings).patch(thread_id, body, pre)
    return _with_etag(response, thread)


@router.delete("/{thread_id}", status_code=204, responses=responses(404, 410, 412, 428),
               summary="Delete a thread and everything in it")
async def delete_thread(thread_id: ThreadId, session: WriteSession, principal: WriteAccess,
                        settings: SettingsDep, pre: Conditions) -> Response:
    await ThreadService(session, principal, settings).delete(thread_id, pre)
    return Response(status_code=204)
