from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Request, Response

from app.agent_states.schemas import AgentStateOut, AgentStatePatch, AgentStateReplace
from app.agent_states.service import AgentStateService, state_path
from app.auth.dependencies import ReadAccess, WriteAccess
from app.core.conditional import Conditions, etag, not_modified
from app.core.limits import SettingsDep
from app.core.pagination import Cursor, Limit, Page, set_next_link
from app.core.problems import responses
from app.core.schemas import NAME_PATTERN, json_object_param, name_path
from app.db.session import ReadSession, WriteSession

router = APIRouter(tags=["agent states"])

ThreadId = Annotated[str, name_path("Thread id")]
AgentName = Annotated[str, name_path("Agent name")]
STATE = "/v1/threads/{thread_id}/agents/{agent_name}/state"
MERGE_PATCH = {"application/merge-patch+json": {
    "schema": {"$ref": "#/components/schemas/AgentStatePatch"}}}


def _with_etag(response: Response, state: AgentStateOut) -> AgentStateOut:
    response.headers["ETag"] = etag(state.revision)
    return state


@router.get(STATE, responses={**responses(404), 304: {"description": "Not Modified"}},
            summary="Get an agent's state in a thread")
async def get_agent_state(
    thread_id: ThreadId, agent_name: AgentName, response: Response, session: ReadSession,
    principal: ReadAccess, settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> AgentStateOut:
    state = await AgentStateService(session, principal, settings).get(thread_id, agent_name)
    if not_modified(if_none_match, state.revision):
        return Response(status_code=304, headers={"ETag": etag(state.revision)})  # type: ignore[return-value]
    return _with_etag(response, state)


@router.put(STATE, responses={**responses(409, 410, 412, 428), 201: {"model": AgentStateOut}},
            summary="Create or replace an agent's state (creates the thread if needed)")
async def put_agent_state(thread_id: ThreadId, agent_name: AgentName, body: AgentStateReplace,
                          response: Response, session: WriteSession, principal: WriteAccess,
                          settings: SettingsDep, pre: Conditions) -> AgentStateOut:
    state, created = await AgentStateService(session, principal, settings).replace(
        thread_id, agent_name, body, pre
    )
    if created:
        response.status_code = 201
        response.headers["Location"] = state_path(thread_id, agent_name)
    return _with_etag(response, state)


@router.patch(STATE, responses=responses(404, 410, 412, 428),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch an agent's state (RFC 7396)")
async def patch_agent_state(thread_id: ThreadId, agent_name: AgentName,
                            body: Annotated[AgentStatePatch, Body()], response: Response,
                            session: WriteSession, principal: WriteAccess,
                            settings: SettingsDep, pre: Conditions) -> AgentStateOut:
    state = await AgentStateService(session, principal, settings).patch(
        thread_id, agent_name, body, pre
    )
    return _with_etag(response, state)


@router.delete(STATE, status_code=204, responses=responses(404, 410, 412, 428),
               summary="Delete an agent's state")
async def delete_agent_state(thread_id: ThreadId, agent_name: AgentName, session: WriteSession,
                             principal: WriteAccess, settings: SettingsDep,
                             pre: Conditions) -> Response:
    await AgentStateService(session, principal, settings).delete(thread_id, agent_name, pre)
    return Response(status_code=204)


@router.get("/v1/threads/{thread_id}/agents", responses=responses(404),
            summary="List a thread's agent states by agent_name")
async def list_thread_agent_states(
    thread_id: ThreadId, request: Request, response: Response, session: ReadSession,
    principal: ReadAccess, settings: SettingsDep, limit: Limit = 20, cursor: Cursor = None,
) -> Page[AgentStateOut]:
    data, next_cursor = await AgentStateService(session, principal, settings).list_thread(
        thread_id, limit=limit, cursor=cursor
    )
    set_next_link(request, response, next_cursor)
    return Page(data=data, next_cursor=next_cursor, has_more=next_cursor is not None)


@router.get("/v1/agent-states", responses=responses(),
            summary="Query agent states across threads, sorted by (thread_id, agent_name)")
async def query_agent_states(
    request: Request, response: Response, session: ReadSession, principal: ReadAccess,
    settings: SettingsDep, limit: Limit = 20, cursor: Cursor = None,
    agent_name: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    thread_id: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    state_contains: Annotated[str | None, Query(
        description='JSON object; containment inside `state` (Postgres `@>` semantics on every '
                    'backend), e.g. `{"status": "running", "tools": ["search"]}`.')] = None,
) -> Page[AgentStateOut]:
    data, next_cursor = await AgentStateService(session, principal, settings).query(
        limit=limit, cursor=cursor, agent_name=agent_name, thread_id=thread_id,
        state_contains=json_object_param("state_contains", state_contains),
    )
    set_next_link(request, response, next_cursor)
    return Page(data=data, next_cursor=next_cursor, has_more=next_cursor is not None)
