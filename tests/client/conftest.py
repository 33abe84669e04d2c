"""Fixtures for the client tests: one real `agentstate serve` per backend, and the async
client on the in-process app (`api`) for the framework adapters' tests.

Every test that uses `server` (or `client`, built on it) starts that process, so it is marked
`@pytest.mark.slow`. There is no probing of the server's routes: a route the client calls
that the server lacks is a failing test, not a skipped one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient
from fastapi import FastAPI

from tests.support import ServerProcess


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[ServerProcess]:
    """A real server process on each backend, shared by the client tests of the run, with a
    key for MCP secrets."""
    from app.core.secretbox import new_key

    with ServerProcess(database_url, env={"AGENTSTATE_SECRET_KEYS": new_key()}) as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> Iterator[AgentStateClient]:
    with AgentStateClient(server.base_url, backoff=0.01) as c:
        yield c


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[AsyncAgentStateClient]:
    """The async client on the in-process app (no server process: for the adapters' tests)."""
    async with AsyncAgentStateClient("http://agentstate.test",
                                     transport=httpx.ASGITransport(app=app)) as client:
        yield client


class Counting(httpx.AsyncBaseTransport):
    """The in-process app's ASGI transport, keeping each request's method, path, query and
    body, and each answer's body."""

    def __init__(self, app: FastAPI) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.seen: list[str] = []
        self.queries: list[str] = []
        self.bodies: list[bytes] = []
        self.answers: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        self.queries.append(request.url.query.decode())
        self.bodies.append(request.content)
        answer = await self.inner.handle_async_request(request)
        self.answers.append(await answer.aread())
        return httpx.Response(answer.status_code, headers=answer.headers,
                              content=self.answers[-1], request=request)


@pytest.fixture
async def transport(app: FastAPI) -> Counting:
    return Counting(app)


@pytest.fixture
async def saver(transport: Counting) -> AsyncIterator[Any]:
    """An `AgentStateSaver` whose asyncio client goes to the in-process app through
    `transport` (its blocking client is not used)."""
    from agentstate_client.langgraph import AgentStateSaver

    async with AsyncAgentStateClient("http://agentstate.test", transport=transport) as api:
        made = AgentStateSaver(base_url="http://unused.invalid", async_client=api)
        yield made
        made.close()
