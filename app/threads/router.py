from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Body, Path, Query, Request, Response

from app.core.pagination import Page
from app.core.schemas import AwareTimestamp, Name
from app.http.dependencies import ConditionalReader, ConditionalWriter, Reader, Writer
from app.http.pagination import Cursor, Limit, linked, linked_json
from app.http.params import ThreadId, json_object_param
from app.http.preconditions import (
    NOT_MODIFIED,
    conditional_json,
    json_with_etag,
)
from app.http.problems import responses
from app.http.routing import DomainRouter
from app.messages.schemas import MEMBERS_DOC, MEMBERS_SCHEMA, MessageMembers, member_set
from app.threads.aggregate import thread_path
from app.threads.schemas import (
    RenderedThread,
    ThreadCreate,
    ThreadFork,
    ThreadOut,
    ThreadPatch,
    ThreadReplace,
    ThreadRevisionOut,
    ThreadWithMessages,
)
from app.threads.service import ThreadService

router = DomainRouter(prefix="/v1/threads", tags=["threads"])

MessagesFields = Annotated[MessageMembers | None, Query(
    json_schema_extra=MEMBERS_SCHEMA, description=f"With include=messages: {MEMBERS_DOC}")]
MERGE_PATCH = {"application/merge-patch+json": {"schema": {"$ref": "#/components/schemas/ThreadPatch"}}}


@router.post("", status_code=201, responses=responses(409), response_model=ThreadOut,
             summary="Create a thread")
async def create_thread(body: ThreadCreate, uow: Writer) -> Response:
    return created(await ThreadService(uow).create(body))


@router.get("", responses=responses(), response_model=Page[ThreadWithMessages],
            response_model_exclude_unset=True,
            summary="List threads, newest first (created or updated)")
async def list_threads(
    request: Request, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
    metadata: Annotated[str | None, Query(description="JSON object; containment (@>).")] = None,
    updated_after: Annotated[AwareTimestamp | None, Query(
        description="RFC 3339 timestamp with an offset (Z or +hh:mm); none is 422.")] = None,
    order_by: Annotated[Literal["created_at", "updated_at"], Query(
        description="Newest first by creation (default) or by last change.")] = "created_at",
    thread_id: Annotated[list[Name] | None, Query(
        max_length=100, description="Only these threads (repeat the parameter, up to 100): "
        "several threads read in one request.")] = None,
    forked_from: Annotated[Name | None, Query(
        description="Only the forks made from this thread (their `forked_from.thread_id`).")
    ] = None,
    include: Annotated[Literal["messages"] | None, Query(
        description="`messages`: each thread with the first page of its live view, as "
                    "`GET /v1/threads/{thread_id}?include=messages` gives it.")] = None,
    messages_limit: Annotated[int, Query(ge=1, le=1000, description="With include=messages: "
                                         "each thread's page size, 1-1000.")] = 100,
    messages_fields: MessagesFields = None,
) -> Response:
    service = ThreadService(uow)
    filters = {"limit": limit, "cursor": cursor, "updated_after": updated_after,
               "metadata": json_object_param("metadata", metadata, uow.settings.max_json_depth),
               "order_by": order_by, "thread_ids": thread_id, "forked_from": forked_from}
    if include == "messages":
        return linked_json(request, await service.list_with_messages(
            messages_limit=messages_limit, messages_fields=member_set(messages_fields),
            **filters))
    return linked_json(request, await service.list(**filters))


@router.get("/{thread_id}", responses={**responses(404), **NOT_MODIFIED},
            response_model=ThreadWithMessages, response_model_exclude_unset=True,
            summary="Get a thread")
async def get_thread(
    thread_id: ThreadId, uow: ConditionalReader,
    include: Annotated[Literal["messages"] | None, Query(
        description="`messages`: add the first page of the live view as `messages`.")] = None,
    messages_limit: Annotated[int, Query(ge=1, le=1000, description="With include=messages: "
                                         "page size, 1-1000.")] = 100,
    messages_fields: MessagesFields = None,
) -> Response:
    service = ThreadService(uow)
    thread = await (service.get(thread_id) if include != "messages"
                    else service.get_with_messages(thread_id, messages_limit,
                                                   member_set(messages_fields)))
    return conditional_json(thread.json, thread.revision, uow.preconditions)


@router.put("/{thread_id}", responses={**responses(409, 410, 412, 428), 201: {"model": ThreadOut}},
            response_model=ThreadOut, summary="Create or replace a thread")
async def put_thread(thread_id: ThreadId, body: ThreadReplace, uow: ConditionalWriter) -> Response:
    thread, made = await ThreadService(uow).replace(thread_id, body, uow.preconditions)
    return created(thread) if made else json_with_etag(thread.json, thread.revision)


@router.patch("/{thread_id}", responses=responses(404, 410, 412, 428),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}}, response_model=ThreadOut,
              summary="Merge-patch a thread (RFC 7396)")
async def patch_thread(thread_id: ThreadId, body: Annotated[ThreadPatch, Body()],
                       uow: ConditionalWriter) -> Response:
    thread = await ThreadService(uow).patch(thread_id, body, uow.preconditions)
    return json_with_etag(thread.json, thread.revision)


@router.delete("/{thread_id}", status_code=204, responses=responses(404, 410, 412, 428),
               summary="Delete a thread and everything in it")
async def delete_thread(thread_id: ThreadId, uow: ConditionalWriter) -> Response:
    await ThreadService(uow).delete(thread_id, uow.preconditions)
    return Response(status_code=204)


@router.get("/{thread_id}/revisions", responses=responses(404),
            summary="List a thread's kept state history, newest first")
async def list_thread_revisions(
    thread_id: ThreadId, request: Request, response: Response, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
) -> Page[ThreadRevisionOut]:
    """One entry per write that set the state or metadata (create, PUT, PATCH), kept for the
    thread's last `history_limit` revisions."""
    page = await ThreadService(uow).revisions(thread_id, limit=limit, cursor=cursor)
    return linked(request, response, page)


@router.get("/{thread_id}/revisions/{revision}", responses=responses(404),
            summary="Get a thread's state and metadata as they were at a revision")
async def get_thread_revision(
    thread_id: ThreadId, uow: Reader,
    revision: Annotated[int, Path(ge=1, le=2**62)],
) -> ThreadRevisionOut:
    return await ThreadService(uow).revision(thread_id, revision)


@router.post("/{thread_id}/fork", status_code=201, responses=responses(404, 412),
             response_model=ThreadOut, summary="Fork a thread at a revision into a new thread")
async def fork_thread(thread_id: ThreadId, body: ThreadFork, uow: Writer) -> Response:
    """The new thread gets the state and metadata of that revision, the messages and
    compactions as they were then, and the agent states. 412 `already_exists` if the new id
    is a live thread; 422 `revision_not_kept` for a revision outside the kept history."""
    return created(await ThreadService(uow).fork(thread_id, body))


def created(thread: RenderedThread) -> Response:
    """201 with the new thread, its ETag and its Location."""
    return json_with_etag(thread.json, thread.revision, status_code=201,
                          headers={"Location": thread_path(thread.thread_id)})
