from __future__ import annotations

from typing import Annotated

from fastapi import Body, Query, Request, Response

from app.agent_states.schemas import AgentStateOut, AgentStatePatch, AgentStateReplace
from app.agent_states.service import AgentStateService, state_path
from app.core.pagination import Page
from app.core.schemas import NAME_PATTERN
from app.http.dependencies import ConditionalReader, ConditionalWriter, Reader
from app.http.pagination import Cursor, Limit, linked
from app.http.params import AgentName, ThreadId, json_object_param
from app.http.preconditions import NOT_MODIFIED, conditional, with_etag
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(tags=["agent states"])

STATE = "/v1/threads/{thread_id}/agents/{agent_name}/state"
MERGE_PATCH = {"application/merge-patch+json": {
    "schema": {"$ref": "#/components/schemas/AgentStatePatch"}}}


@router.get(STATE, response_model=AgentStateOut, responses={**responses(404), **NOT_MODIFIED},
            summary="Get an agent's state in a thread")
async def get_agent_state(thread_id: ThreadId, agent_name: AgentName, response: Response,
                          uow: ConditionalReader) -> AgentStateOut | Response:
    state = await AgentStateService(uow).get(thread_id, agent_name)
    return conditional(response, state, state.revision, uow.preconditions)


@router.put(STATE, responses={**responses(409, 410, 412, 428), 201: {"model": AgentStateOut}},
            summary="Create or replace an agent's state (creates the thread if needed)")
async def put_agent_state(thread_id: ThreadId, agent_name: AgentName, body: AgentStateReplace,
                          response: Response, uow: ConditionalWriter) -> AgentStateOut:
    state, created = await AgentStateService(uow).replace(
        thread_id, agent_name, body, uow.preconditions
    )
    if created:
        response.status_code = 201
        response.headers["Location"] = state_path(thread_id, agent_name)
    return with_etag(response, state, state.revision)


@router.patch(STATE, responses=responses(404, 410, 412, 428),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch an agent's state (RFC 7396)")
async def patch_agent_state(thread_id: ThreadId, agent_name: AgentName,
                            body: Annotated[AgentStatePatch, Body()], response: Response,
                            uow: ConditionalWriter) -> AgentStateOut:
    state = await AgentStateService(uow).patch(thread_id, agent_name, body, uow.preconditions)
    return with_etag(response, state, state.revision)


@router.delete(STATE, status_code=204, responses=responses(404, 410, 412, 428),
               summary="Delete an agent's state")
async def delete_agent_state(thread_id: ThreadId, agent_name: AgentName,
                             uow: ConditionalWriter) -> Response:
    await AgentStateService(uow).delete(thread_id, agent_name, uow.preconditions)
    return Response(status_code=204)


@router.get("/v1/threads/{thread_id}/agents", responses=responses(404),
            summary="List a thread's agent states by agent_name")
async def list_thread_agent_states(
    thread_id: ThreadId, request: Request, response: Response, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
) -> Page[AgentStateOut]:
    page = await AgentStateService(uow).list_thread(thread_id, limit=limit,
                                                              cursor=cursor)
    return linked(request, response, page)


@router.get("/v1/agent-states", responses=responses(),
            summary="Query agent states across threads, sorted by (thread_id, agent_name)")
async def query_agent_states(
    request: Request, response: Response, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
    agent_name: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    thread_id: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    state_contains: Annotated[str | None, Query(
        description='JSON object; containment inside `state` (Postgres `@>` semantics on every '
                    'backend), e.g. `{"status": "running", "tools": ["search"]}`.')] = None,
) -> Page[AgentStateOut]:
    page = await AgentStateService(uow).query(
        limit=limit, cursor=cursor, agent_name=agent_name, thread_id=thread_id,
        state_contains=json_object_param("state_contains", state_contains,
                                         uow.settings.max_json_depth),
    )
    return linked(request, response, page)
