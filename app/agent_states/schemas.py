from __future__ import annotations

from app.core.schemas import JsonObject, RowModel, Strict, Timestamp


class AgentStateReplace(Strict):
    state: JsonObject


class AgentStatePatch(Strict):
    """RFC 7396 merge-patch of the representation; only `state` can change."""

    state: JsonObject | None = None


class AgentStateOut(RowModel):
    thread_id: str
    agent_name: str
    revision: int
    state: JsonObject
    created_at: Timestamp
    updated_at: Timestamp
