from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.core.pagination import Page
from app.core.revisions import etag
from app.core.schemas import AwareTimestamp
from app.http.dependencies import WRITE_FIRST, IfMatchWriter, Reader
from app.http.idempotency import IdempotencyDep, created
from app.http.pagination import Cursor, linked, linked_json
from app.http.params import MessageId, ThreadId
from app.http.preconditions import with_etag
from app.http.problems import responses
from app.http.routing import DomainRouter
from app.messages.schemas import (
    MEMBERS_DOC,
    MEMBERS_SCHEMA,
    ROLE_MAX,
    AppendOut,
    LineageMessageOut,
    MessageBatch,
    MessageIn,
    MessageMembers,
    MessageOut,
    MessageRedaction,
    MessageRemoval,
    PageMessage,
    RemoveOut,
    member_set,
)
from app.messages.service import ABOVE_ANY_SEQ, MessageService, Order, View

router = DomainRouter(prefix="/v1/threads/{thread_id}/messages", tags=["messages"])

MessageLimit = Annotated[int, Query(ge=1, le=1000, description="Page size, 1-1000.")]

APPEND_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"oneOf": [
        {"$ref": "#/components/schemas/MessageIn"},
        {"type": "object", "title": "MessageBatch", "additionalProperties": False,
         "required": ["messages"],
         "properties": {"messages": {"type": "array", "minItems": 1,
                                     "items": {"$ref": "#/components/schemas/MessageIn"}}}},
    ]}}},
}


async def append_body(request: Request) -> list[MessageIn]:
    """One message, or `{"messages": [...]}`. Parsed here, not as a pydantic union, so an
    error points into the body the client sent (`/messages/0/role`), not at a union branch."""
    raw = await request.body()
    data: Any = await request.json() if raw.strip() else None  # parsed once, by the middleware
    batch = isinstance(data, dict) and "messages" in data
    try:
        if batch:
            return MessageBatch.model_validate(data).messages
        return [MessageIn.model_validate(data)]
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        ) from None


@router.post("", status_code=201, response_model=AppendOut,
             responses=responses(409, 410, 412), openapi_extra={"requestBody": APPEND_BODY},
             dependencies=[WRITE_FIRST],
             summary="Append one message or a batch")
async def append_messages(
    thread_id: ThreadId, messages: Annotated[list[MessageIn], Depends(append_body)],
    uow: IfMatchWriter, idempotency: IdempotencyDep,
) -> Response:
    """Appends in order as one new thread revision; a thread that does not exist is created.
    409 `message_exists` if a client-chosen id is taken (nothing is written),
    409 `idempotency_in_flight`, 422 `idempotency_key_reused`, 410 if the thread was deleted."""
    body, replayed = await MessageService(uow).append(
        thread_id, messages, uow.preconditions, idempotency
    )
    return created(body, replayed, {"ETag": etag(body["thread_revision"])})


@router.get("", response_model=Page[PageMessage], responses=responses(404),
            summary="Page through a thread's messages")
async def list_messages(
    thread_id: ThreadId, request: Request, uow: Reader,
    limit: MessageLimit = 20, cursor: Cursor = None, order: Order = "asc",
    view: Annotated[View, Query(
        description="live: what the model sees (summaries stand in for compacted runs); "
        "full: everything, summaries included.")] = "live",
    after_seq: Annotated[int | None, Query(ge=0, le=ABOVE_ANY_SEQ,
                                           description="Only position > after_seq.")] = None,
    before_seq: Annotated[int | None, Query(ge=0, le=ABOVE_ANY_SEQ,
                                            description="Only position < before_seq.")] = None,
    role: Annotated[str | None, Query(min_length=1, max_length=ROLE_MAX)] = None,
    agent_name: str | None = None,
    created_after: Annotated[AwareTimestamp | None, Query(
        description="Only messages stored after this RFC 3339 timestamp (with its offset).")
    ] = None,
    fields: Annotated[MessageMembers | None, Query(json_schema_extra=MEMBERS_SCHEMA,
                                                   description=MEMBERS_DOC)] = None,
) -> Response:
    page = await MessageService(uow).list(
        thread_id, view=view, order=order, cursor=cursor, after_seq=after_seq,
        before_seq=before_seq, role=role, agent_name=agent_name,
        created_after=created_after, limit=limit,
        fields=member_set(fields),
    )
    return linked_json(request, page)


@router.get("/{message_id}", responses=responses(404), summary="Get one message")
async def get_message(thread_id: ThreadId, message_id: MessageId, uow: Reader) -> MessageOut:
    return await MessageService(uow).get(thread_id, message_id)


@router.post(":remove", response_model=RemoveOut, responses=responses(404, 409, 410, 412),
             summary="Remove messages: by id, the last n, or a range (trim)")
async def remove_messages(thread_id: ThreadId, body: MessageRemoval, response: Response,
                          uow: IfMatchWriter) -> RemoveOut:
    """Deletes the messages named (their content leaves the database) as one new thread
    revision, and answers them. 409 `message_compacted` for a message a live compaction
    replaced or wrote; nothing is removed then. Removing nothing takes no revision."""
    removed = await MessageService(uow).remove(thread_id, body, uow.preconditions)
    return with_etag(response, removed, removed.thread_revision)


@router.delete("/{message_id}", response_model=RemoveOut,
               responses=responses(404, 409, 410, 412), summary="Remove one message")
async def delete_message(thread_id: ThreadId, message_id: MessageId, response: Response,
                         uow: IfMatchWriter) -> RemoveOut:
    """As `POST .../messages:remove` with `{"ids": [message_id]}`."""
    removed = await MessageService(uow).remove(
        thread_id, MessageRemoval(ids=[message_id]), uow.preconditions)
    return with_etag(response, removed, removed.thread_revision)


@router.patch("/{message_id}", responses=responses(404, 409, 410, 412),
              summary="Redact a message: replace its content, item or metadata")
async def redact_message(thread_id: ThreadId, message_id: MessageId,
                         body: Annotated[MessageRedaction, Body()], response: Response,
                         uow: IfMatchWriter) -> MessageOut:
    """The members sent overwrite the stored ones in place (the old values are not kept),
    as one new thread revision (`ETag`); event `message.redacted`."""
    message, revision = await MessageService(uow).redact(thread_id, message_id, body,
                                                         uow.preconditions)
    return with_etag(response, message, revision)


# Reads that find a message by its id across the tenant's threads.
lineage_router = DomainRouter(prefix="/v1/messages", tags=["messages"])


@lineage_router.get("/{message_id}/lineage", responses=responses(404, 409),
                    summary="A message and the ones before it along parent links")
async def get_message_lineage(
    message_id: MessageId, request: Request, response: Response, uow: Reader,
    cursor: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="The last this many, 1-1000.")] = 100,
) -> Page[LineageMessageOut]:
    """The message with this id, in whichever of the tenant's threads holds it, and the
    messages before it along `parent_id` links (across threads), oldest first: the last
    `limit` of them; `next_cursor` (with `has_more`) continues with the older ones. One query
    however long the history. 404 if no message has the id, 409 `message_ambiguous` if
    several have it (a forked thread keeps its source's ids)."""
    page = await MessageService(uow).lineage(message_id, limit=limit, cursor=cursor)
    return linked(request, response, page)
