"""Fixtures for the client tests: one real `agentstate serve` per backend, and probes of the
server's OpenAPI document so tests of endpoints that are not there yet skip instead of fail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agentstate_client import AgentStateClient

from tests.support import ServerProcess


def _server_paths() -> set[str]:
    from app.core.settings import Settings
    from app.main import create_app

    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:", _env_file=None))  # type: ignore[call-arg]
    return set(app.openapi()["paths"])


SERVER_PATHS = _server_paths()


def requires(*paths: str) -> pytest.MarkDecorator:
    """Skip unless the server's OpenAPI document has every one of `paths`."""
    missing = [path for path in paths if path not in SERVER_PATHS]
    return pytest.mark.skipif(bool(missing), reason=f"server has no {', '.join(missing)} yet")


MESSAGES = "/v1/threads/{thread_id}/messages"
COMPACTIONS = "/v1/threads/{thread_id}/compactions"
AGENT_STATE = "/v1/threads/{thread_id}/agents/{agent_name}/state"
MCP_SERVER = "/v1/mcp-servers/{server_name}"
EVENTS = "/v1/events"


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
