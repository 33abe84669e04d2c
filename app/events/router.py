from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.core.schemas import INT64_MAX, NAME_PATTERN
from app.events.schemas import EventPage, EventType
from app.events.service import EventService
from app.http.dependencies import Reader
from app.http.pagination import Cursor, Limit, set_next_link
from app.http.problems import responses

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.get("", responses=responses(), summary="Page the audit log of committed changes")
async def list_events(
    request: Request, response: Response, uow: Reader, limit: Limit = 20, cursor: Cursor = None,
    after: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="Start after this seq; `cursor` wins.")] = None,
    thread_id: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    type: Annotated[list[EventType] | None, Query(description="Exact type; repeatable.")] = None,
) -> EventPage:
    """Oldest first, in commit order (`seq`). `next_cursor` is never null: a poller that passes
    back the last one gets exactly the events committed since, each once."""
    page = await EventService(uow).list(
        limit=limit, cursor=cursor, after=after, thread_id=thread_id,
        types=list(type) if type else None,
    )
    set_next_link(request, response, page.next_cursor if page.has_more else None)
    return page
