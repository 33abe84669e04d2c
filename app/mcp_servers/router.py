from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Request, Response

from app.auth.dependencies import ReadAccess, WriteAccess
from app.core.conditional import Conditions, etag, not_modified
from app.core.limits import SettingsDep
from app.core.pagination import Cursor, Limit, Page, set_next_link
from app.core.problems import responses
from app.core.schemas import NAME_PATTERN, name_path
from app.core.secretbox import SecretBoxDep
from app.db.session import ReadSession, WriteSession
from app.mcp_servers.schemas import McpServerOut, McpServerPatch, McpServerReplace
from app.mcp_servers.service import McpServerService, server_path

router = APIRouter(prefix="/v1/mcp-servers", tags=["mcp servers"])

ServerName = Annotated[str, name_path("Server name")]
IncludeSecrets = Annotated[bool, Query(
    description="Return secret values in clear; needs the `secrets:read` scope (403 otherwise).")]
MERGE_PATCH = {"application/merge-patch+json": {
    "schema": {"$ref": "#/components/schemas/McpServerPatch"}}}


def _with_headers(response: Response, server: McpServerOut,
                  include_secrets: bool = False) -> McpServerOut:
    response.headers["ETag"] = etag(server.revision)
    if include_secrets:
        response.headers["Cache-Control"] = "no-store"
    return server


@router.get("", responses=responses(500), summary="List MCP servers by server_name")
async def list_mcp_servers(
    request: Request, response: Response, session: ReadSession, principal: ReadAccess,
    settings: SettingsDep, box: SecretBoxDep, limit: Limit = 20, cursor: Cursor = None,
    server_type: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    include_secrets: IncludeSecrets = False,
) -> Page[McpServerOut]:
    data, next_cursor = await McpServerService(session, principal, settings, box).list(
        limit=limit, cursor=cursor, server_type=server_type, include_secrets=include_secrets
    )
    set_next_link(request, response, next_cursor)
    if include_secrets:
        response.headers["Cache-Control"] = "no-store"
    return Page(data=data, next_cursor=next_cursor, has_more=next_cursor is not None)


@router.get("/{server_name}",
            responses={**responses(404, 500), 304: {"description": "Not Modified"}},
            summary="Get an MCP server's state")
async def get_mcp_server(
    server_name: ServerName, response: Response, session: ReadSession, principal: ReadAccess,
    settings: SettingsDep, box: SecretBoxDep, include_secrets: IncludeSecrets = False,
    if_none_match: Annotated[str | None, Header()] = None,
) -> McpServerOut:
    server = await McpServerService(session, principal, settings, box).get(
        server_name, include_secrets=include_secrets
    )
    if not_modified(if_none_match, server.revision):
        return Response(status_code=304, headers={"ETag": etag(server.revision)})  # type: ignore[return-value]
    return _with_headers(response, server, include_secrets)


@router.put("/{server_name}",
            responses={**responses(409, 412, 428, 500), 201: {"model": McpServerOut}},
            summary="Create or replace an MCP server's state")
async def put_mcp_server(server_name: ServerName, body: McpServerReplace, response: Response,
                         session: WriteSession, principal: WriteAccess, settings: SettingsDep,
                         box: SecretBoxDep, pre: Conditions) -> McpServerOut:
    server, created = await McpServerService(session, principal, settings, box).replace(
        server_name, body, pre
    )
    if created:
        response.status_code = 201
        response.headers["Location"] = server_path(server_name)
    return _with_headers(response, server)


@router.patch("/{server_name}", responses=responses(404, 412, 428, 500),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch an MCP server's state (RFC 7396)")
async def patch_mcp_server(server_name: ServerName, body: Annotated[McpServerPatch, Body()],
                           response: Response, session: WriteSession, principal: WriteAccess,
                           settings: SettingsDep, box: SecretBoxDep,
                           pre: Conditions) -> McpServerOut:
    server = await McpServerService(session, principal, settings, box).patch(
        server_name, body, pre
    )
    return _with_headers(response, server)


@router.delete("/{server_name}", status_code=204, responses=responses(404, 412, 428),
               summary="Delete an MCP server's state and secrets")
async def delete_mcp_server(server_name: ServerName, session: WriteSession,
                            principal: WriteAccess, settings: SettingsDep, box: SecretBoxDep,
                            pre: Conditions) -> Response:
    await McpServerService(session, principal, settings, box).delete(server_name, pre)
    return Response(status_code=204)
