from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.core.pagination import Page
from app.core.revisions import etag
from app.http.dependencies import WRITE_FIRST, Reader, SettingsDep, Writer
from app.http.idempotency import IdempotencyDep, created
from app.http.pagination import Cursor, linked
from app.http.params import MessageId, ThreadId
from app.http.preconditions import ThreadIfMatch
from app.http.problems import responses
from app.http.routing import ParsedBodyRoute
from app.messages.schemas import AppendOut, MessageBatch, MessageIn, MessageOut, Role
from app.messages.service import ABOVE_ANY_SEQ, MessageService, Order, View

router = APIRouter(prefix="/v1/threads/{thread_id}/messages", tags=["messages"],
                   route_class=ParsedBodyRoute)

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
    uow: Writer, settings: SettingsDep, pre: ThreadIfMatch, idempotency: IdempotencyDep,
) -> Response:
    """Appends in order as one new thread revision; a thread that does not exist is created.
    409 `message_exists` if a client-chosen id is taken (nothing is written),
    409 `idempotency_in_flight`, 422 `idempotency_key_reused`, 410 if the thread was deleted."""
    body, replayed = await MessageService(uow, settings).append(
        thread_id, messages, pre, idempotency
    )
    return created(body, replayed, {"ETag": etag(body["thread_revision"])})


@router.get("", responses=responses(404), summary="Page through a thread's messages")
async def list_messages(
    thread_id: ThreadId, request: Request, response: Response, uow: Reader,
    settings: SettingsDep, limit: MessageLimit = 20, cursor: Cursor = None, order: Order = "asc",
    view: Annotated[View, Query(
        description="live: what the model sees (summaries stand in for compacted runs); "
        "full: everything, summaries included.")] = "live",
    after_seq: Annotated[int | None, Query(ge=0, le=ABOVE_ANY_SEQ,
                                           description="Only position > after_seq.")] = None,
    before_seq: Annotated[int | None, Query(ge=0, le=ABOVE_ANY_SEQ,
                                            description="Only position < before_seq.")] = None,
    role: Role | None = None,
    agent_name: str | None = None,
) -> Page[MessageOut]:
    page = await MessageService(uow, settings).list(
        thread_id, view=view, order=order, cursor=cursor, after_seq=after_seq,
        before_seq=before_seq, role=role, agent_name=agent_name, limit=limit,
    )
    return linked(request, response, page)


@router.get("/{message_id}", responses=responses(404), summary="Get one message")
async def get_message(thread_id: ThreadId, message_id: MessageId, uow: Reader,
                      settings: SettingsDep) -> MessageOut:
    return await MessageService(uow, settings).get(thread_id, message_id)
