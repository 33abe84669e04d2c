from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from app.core.schemas import RowModel, Timestamp

EventType = Literal[
    "thread.created", "thread.updated", "thread.deleted", "thread.forked",
    "message.appended", "message.removed", "message.redacted",
    "compaction.created", "compaction.reverted",
    "agent_state.created", "agent_state.updated", "agent_state.deleted",
    "mcp_server.created", "mcp_server.updated", "mcp_server.deleted",
    "store.item.created", "store.item.updated", "store.item.deleted", "store.item.expired",
]


class EventOut(RowModel):
    seq: int = Field(description="The tenant's own order (1, 2, 3, ...), in which events "
                                 "become visible; the only order of the feed.")
    at: Timestamp
    type: str
    thread_id: str | None = Field(None, description="Present when the change is in a thread.")
    resource: str = Field(description="Path of the changed resource.")
    revision: int | None = Field(description="The revision the change produced.")
    actor: str = Field(description='The API key id, or "anonymous" when the server runs open.')

    @model_serializer(mode="wrap")
    def _omit_absent_thread(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # unannotated: keeps the fields in the OpenAPI schema
        data: dict[str, Any] = handler(self)
        if data.get("thread_id") is None:
            data.pop("thread_id", None)
        return data


class EventPage(BaseModel):
    data: list[EventOut]
    next_cursor: str = Field(
        description="Never null: pass it back to get exactly the events committed since."
    )
    has_more: bool
