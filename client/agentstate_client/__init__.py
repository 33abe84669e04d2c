"""agentstate_client: a thin, typed client for the agentstate HTTP API.

    from agentstate_client import AgentStateClient

    with AgentStateClient("http://127.0.0.1:8080") as client:
        thread = client.create_thread(state={"step": 0})
        client.append_message(thread.thread_id, "user", "Hello")
        client.update_thread(thread.thread_id, lambda s: {**s, "step": s["step"] + 1})

Drop-ins for existing agent code: `agentstate_client.aisuite.AgentStateStore` (aisuite's
`StateStore`) and `agentstate_client.colosseum` (the Colosseum helper functions).
"""

from agentstate_client._async import AsyncAgentStateClient
from agentstate_client._core import __version__
from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import (
    AgentStateError,
    AlreadyExists,
    APIConnectionError,
    APIError,
    APITimeoutError,
    Conflict,
    NotFound,
    PreconditionFailed,
    PreconditionRequired,
    RevisionMismatch,
    ThreadDeleted,
    Unauthorized,
)
from agentstate_client.models import (
    AgentState,
    AppendResult,
    Compaction,
    Event,
    McpServer,
    Message,
    Page,
    Thread,
)

__all__ = [
    "APIConnectionError", "APIError", "APITimeoutError", "AgentState", "AgentStateClient",
    "AgentStateError", "AlreadyExists", "AppendResult", "AsyncAgentStateClient", "Compaction",
    "Conflict", "Event", "McpServer", "Message", "NotFound", "Page", "PreconditionFailed",
    "PreconditionRequired", "RevisionMismatch", "Thread", "ThreadDeleted", "Unauthorized",
    "__version__",
]
