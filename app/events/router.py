from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from app.core.errors import NotAcceptable
from app.core.schemas import INT64_MAX, NAME_PATTERN
from app.events.schemas import EventPage, EventType
from app.events.service import EventWatch, Filters
from app.http.dependencies import DatabaseDep, FeedDep, ReadAccess, SettingsDep
from app.http.negotiation import accepts
from app.http.pagination import Cursor, Limit, set_next_link
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(prefix="/v1/events", tags=["events"])

After = Annotated[int | None, Query(ge=0, le=INT64_MAX,
                                    description="Start after this seq; `cursor` wins.")]
ThreadFilter = Annotated[str | None, Query(pattern=NAME_PATTERN)]
TypeFilter = Annotated[list[EventType] | None, Query(description="Exact type; repeatable.")]
ResourcePrefix = Annotated[str | None, Query(
    min_length=1, max_length=1024, pattern=r"^[!-~]+$",
    description="Only events whose `resource` (an ASCII path) starts with this.")]


@router.get("", responses=responses(), summary="Page the tenant's change feed")
async def list_events(
    request: Request, response: Response, principal: ReadAccess, db: DatabaseDep,
    feed: FeedDep, settings: SettingsDep, limit: Limit = 20, cursor: Cursor = None,
    after: After = None, thread_id: ThreadFilter = None, type: TypeFilter = None,
    resource_prefix: ResourcePrefix = None,
    wait: Annotated[float, Query(ge=0, le=3600, description=(
        "Long poll: if nothing is there yet, wait up to this many seconds (capped by the "
        "server's setting) for an event to commit, then answer (empty, with the same cursor, "
        "at the timeout)."))] = 0,
) -> EventPage:
    """Oldest first, in the tenant's own order (`seq`: 1, 2, 3, ... per tenant). `next_cursor`
    is never null: a poller that passes back the last one gets exactly the events committed
    since, each once. The page is read with a connection of its own, not held while waiting."""
    filters = Filters(thread_id, list(type) if type else None, resource_prefix)
    page = await EventWatch(db, feed, principal, settings).poll(
        wait=wait, limit=limit, cursor=cursor, after=after, filters=filters)
    set_next_link(request, response, page.next_cursor if page.has_more else None)
    return page


@router.get("/stream", responses=responses(406), summary="Watch the change feed (Server-Sent Events)",
            response_class=StreamingResponse,
            openapi_extra={"responses": {"200": {"content": {"text/event-stream": {}}}}})
async def stream_events(
    request: Request, principal: ReadAccess, db: DatabaseDep, feed: FeedDep,
    settings: SettingsDep, cursor: Cursor = None, after: After = None,
    thread_id: ThreadFilter = None, type: TypeFilter = None,
    resource_prefix: ResourcePrefix = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description=(
        "The `id` of the last event received: the stream resumes after it (wins over "
        "`cursor`)."))] = None,
) -> StreamingResponse:
    """Every event after the cursor, then each one as it commits, as `text/event-stream`:
    `id:` is the event's cursor, `data:` the event as in `GET /v1/events`; a comment line
    is sent every heartbeat interval while nothing happens."""
    # A stream never ends: it is refused (406) to a client whose Accept excludes it (only
    # other types, or q=0); `*/*` (curl, httpx), `text/*` and no Accept take it.
    if not accepts(request.headers.getlist("accept"), "text/event-stream"):
        raise NotAcceptable("GET /v1/events/stream answers only text/event-stream, which "
                            "this request's Accept excludes; send Accept: text/event-stream.")
    filters = Filters(thread_id, list(type) if type else None, resource_prefix)
    watch = EventWatch(db, feed, principal, settings)
    start = await watch.start(last_event_id or cursor, after)  # a bad cursor is a 400 here
    return StreamingResponse(
        watch.stream(start, filters),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


