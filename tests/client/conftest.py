"""Fixtures for the client tests: one real `agentstate serve` per backend, and the async
client on the in-process app (`api`) for the framework adapters' tests.

Every test that uses `server` (or `client`, built on it) starts that process, so it is marked
`@pytest.mark.slow`. There is no probing of the server's routes: a route the client calls
that the server lacks is a failing test, not a skipped one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

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
