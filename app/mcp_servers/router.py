from __future__ import annotations

from typing import Annotated

from fastapi import Body, Query, Request, Response

from app.core.pagination import Page
from app.core.schemas import NAME_PATTERN
from app.http.dependencies import ConditionalReader, ConditionalWriter, Reader, SecretBoxDep
from app.http.pagination import Cursor, Limit, linked
from app.http.params import ServerName
from app.http.preconditions import NOT_MODIFIED, conditional, with_etag
from app.http.problems import responses
from app.http.routing import DomainRouter
from app.mcp_servers.schemas import McpServerOut, McpServerPatch, McpServerReplace
from app.mcp_servers.service import McpServerService, server_path

router = DomainRouter(prefix="/v1/mcp-servers", tags=["mcp servers"])

IncludeSecrets = Annotated[bool, Query(
    description="Return secret values in clear; needs the `secrets:read` scope (403 otherwise).")]
MERGE_PATCH = {"application/merge-patch+json": {
    "schema": {"$ref": "#/components/schemas/McpServerPatch"}}}


def _no_store(response: Response, include_secrets: bool) -> None:
    if include_secrets:
        response.headers["Cache-Control"] = "no-store"


@router.get("", responses=responses(500), summary="List MCP servers by server_name")
async def list_mcp_servers(
    request: Request, response: Response, uow: Reader,
    box: SecretBoxDep, limit: Limit = 20, cursor: Cursor = None,
    server_type: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    include_secrets: IncludeSecrets = False,
) -> Page[McpServerOut]:
    page = await McpServerService(uow, box).list(
        limit=limit, cursor=cursor, server_type=server_type, include_secrets=include_secrets
    )
    _no_store(response, include_secrets)
    return linked(request, response, page)


@router.get("/{server_name}", response_model=McpServerOut,
            responses={**responses(404, 500), **NOT_MODIFIED}, summary="Get an MCP server's state")
async def get_mcp_server(
    server_name: ServerName, response: Response, uow: ConditionalReader,
    box: SecretBoxDep, include_secrets: IncludeSecrets = False,
) -> McpServerOut | Response:
    server = await McpServerService(uow, box).get(
        server_name, include_secrets=include_secrets
    )
    _no_store(response, include_secrets)
    return conditional(response, server, server.revision, uow.preconditions)


@router.put("/{server_name}",
            responses={**responses(409, 412, 428, 500), 201: {"model": McpServerOut}},
            summary="Create or replace an MCP server's state")
async def put_mcp_server(server_name: ServerName, body: McpServerReplace, response: Response,
                         uow: ConditionalWriter, box: SecretBoxDep) -> McpServerOut:
    server, created = await McpServerService(uow, box).replace(server_name, body, uow.preconditions)
    if created:
        response.status_code = 201
        response.headers["Location"] = server_path(server_name)
    return with_etag(response, server, server.revision)


@router.patch("/{server_name}", responses=responses(404, 412, 428, 500),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch an MCP server's state (RFC 7396)")
async def patch_mcp_server(server_name: ServerName, body: Annotated[McpServerPatch, Body()],
                           response: Response, uow: ConditionalWriter,
                           box: SecretBoxDep) -> McpServerOut:
    server = await McpServerService(uow, box).patch(server_name, body, uow.preconditions)
    return with_etag(response, server, server.revision)


@router.delete("/{server_name}", status_code=204, responses=responses(404, 412, 428),
               summary="Delete an MCP server's state and secrets")
async def delete_mcp_server(server_name: ServerName, uow: ConditionalWriter,
                            box: SecretBoxDep) -> Response:
    await McpServerService(uow, box).delete(server_name, uow.preconditions)
    return Response(status_code=204)
