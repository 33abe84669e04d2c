"""Colosseum drop-in: the helper functions of the Colosseum design, kept on agentstate.

    from agentstate_client.colosseum import (
        load_agent_state, load_conversation_history, save_agent_state, save_conversation)

Same names, signatures and return shapes as the original helpers. A `session_id` is an
agentstate thread (created on first use), an agent's state is that thread's agent state, and
the conversation is the thread's message log. Unlike the original, `save_agent_state` keeps
one record per agent and session (an upsert with a revision, not a new row per call), and
history comes back in append order (`seq`), never reordered by equal timestamps.

The server is `$AGENTSTATE_URL` with `$AGENTSTATE_API_KEY`, read on first use, or whatever
`configure(...)` set.
"""

from __future__ import annotations

import threading
from typing import Any

from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import AgentStateError, AlreadyExists, NotFound, RevisionMismatch

__all__ = [
    "configure", "load_agent_state", "load_conversation_history", "save_agent_state",
    "save_conversation",
]

PAGE = 1000
ATTEMPTS = 10
_lock = threading.Lock()
_client: AgentStateClient | None = None
_owned = False


def configure(base_url: str | None = None, *, api_key: str | None = None,
              client: AgentStateClient | None = None) -> AgentStateClient:
    """Point the helpers at a server (or at your own `client`) and return the client used.
    Without it, the first helper call configures from `$AGENTSTATE_URL`/`$AGENTSTATE_API_KEY`.
    Call it before agents start: a client it made earlier is closed."""
    global _client, _owned
    with _lock:
        previous, previous_owned = _client, _owned
        _client = client or AgentStateClient(base_url, api_key=api_key)
        _owned = client is None
        configured = _client
    if previous is not None and previous_owned:
        previous.close()
    return configured


def _get_client() -> AgentStateClient:
    global _client, _owned
    if _client is not None:
        return _client
    # Agents often start in parallel: exactly one of them builds the shared client.
    with _lock:
        if _client is None:
            _client, _owned = AgentStateClient(), True
        return _client


def save_agent_state(agent_name: str, session_id: str, state_data: dict[str, Any]) -> None:
    """Save or update agent state (last writer wins, as in the original helper)."""
    client = _get_client()
    for _ in range(ATTEMPTS):
        try:
            client.put_agent_state(session_id, agent_name, state_data, if_match="*")
            return
        except RevisionMismatch as exc:  # If-Match: * on a state that does not exist yet
            if exc.current_revision is not None:
                raise
        try:
            client.put_agent_state(session_id, agent_name, state_data, create_only=True)
            return
        except AlreadyExists:  # another writer created it just now: overwrite theirs
            continue
    raise AgentStateError(f"The state of {agent_name!r} in {session_id!r} kept being created "
                          "and deleted under this save; gave up.")


def load_agent_state(agent_name: str, session_id: str) -> dict[str, Any] | None:
    """Load agent state, returns None if not found."""
    try:
        return _get_client().get_agent_state(session_id, agent_name).state
    except NotFound:
        return None


def save_conversation(session_id: str, agent_name: str, role: str, content: str,
                      metadata: dict[str, Any] | None = None) -> None:
    """Save a conversation message (appended once, even when the request is retried)."""
    _get_client().append_message(session_id, role, content, agent_name=agent_name,
                                 metadata=metadata or {})


def load_conversation_history(session_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Load conversation history for a session: the first `limit` messages (all if None),
    oldest first, as dicts with `agent_name`, `role`, `content`, `metadata`, `timestamp`."""
    history: list[dict[str, Any]] = []
    pages = _get_client().iter_messages(session_id, limit=min(limit or PAGE, PAGE))
    try:
        for message in pages:
            history.append({
                "agent_name": message.agent_name,
                "role": message.role,
                "content": message.content,
                "metadata": message.metadata,
                "timestamp": message.created_at.isoformat(),
            })
            if limit and len(history) >= limit:
                break
    except NotFound:  # no such session yet
        return []
    return history
