"""Agent states (API.md section 6): one JSON state per agent per thread, under section 2."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent_states.repository import AgentStateRepository
from app.agent_states.schemas import AgentStateOut, AgentStatePatch, AgentStateReplace
from app.auth.dependencies import Principal
from app.core.conditional import Preconditions
from app.core.errors import NotFound
from app.core.mergepatch import merge_patch
from app.core.pagination import decode_name_cursor, split_page
from app.core.revisioned import RevisionedResource
from app.core.settings import Settings
from app.db.base import utcnow
from app.events import service as events
from app.threads.service import ThreadService

CURSOR = "agent_states"


def state_path(thread_id: str, agent_name: str) -> str:
    return f"/v1/threads/{thread_id}/agents/{agent_name}/state"


def to_out(row: Row[Any]) -> AgentStateOut:
    return AgentStateOut(
        thread_id=row.thread_id, agent_name=row.agent_name, revision=row.revision,
        state=row.state, created_at=row.created_at, updated_at=row.updated_at,
    )


class AgentStateService:
    def __init__(self, session: AsyncConnection, principal: Principal, settings: Settings) -> None:
        self.session = session
        self.principal = principal
        self.settings = settings
        self.repo = AgentStateRepository(session, principal.tenant_id)
        self.threads = ThreadService(session, principal, settings)

    def _resource(self, thread_id: str, agent_name: str) -> RevisionedResource:
        return RevisionedResource(
            self.repo, (thread_id, agent_name), noun="agent state",
            label=f"Agent state {agent_name!r} of thread {thread_id!r}",
            required=self.settings.require_preconditions,
        )

    def _event(self, change: str, thread_id: str, agent_name: str, revision: int) -> None:
        events.record(self.session, self.principal, f"agent_state.{change}",
                      state_path(thread_id, agent_name), revision=revision, thread_id=thread_id)

    async def _thread_for_change(self, thread_id: str) -> None:
        """PATCH and DELETE never create the thread. A tombstoned thread is 410; a missing one
        is left to section 2 (412 with If-Match, else 404), as for any missing state."""
        try:
            await self.threads.ensure_live(thread_id, create=False)
        except NotFound:
            pass

    async def get(self, thread_id: str, agent_name: str) -> AgentStateOut:
        return to_out(await self._resource(thread_id, agent_name).get())

    async def replace(self, thread_id: str, agent_name: str, body: AgentStateReplace,
                      pre: Preconditions) -> tuple[AgentStateOut, bool]:
        """PUT: returns the state and whether it was created. Creates the thread if needed;
        if the request then fails, the transaction takes the thread back with it."""
        thread = await self.threads.ensure_live(thread_id)
        row, created = await self._resource(thread_id, agent_name).put(
            pre,
            lambda current: {"state": body.state} if current is not None
            else {"state": body.state, "thread_pk": thread.id},
            utcnow(),
        )
        self._event("created" if created else "updated", thread_id, agent_name, row.revision)
        return to_out(row), created

    async def patch(self, thread_id: str, agent_name: str, body: AgentStatePatch,
                    pre: Preconditions) -> AgentStateOut:
        await self._thread_for_change(thread_id)

        def values(current: Row[Any]) -> dict[str, Any]:
            if "state" not in body.model_fields_set:
                return {}
            # `"state": null` removes the member (RFC 7396); for state that means "empty".
            return {"state": merge_patch(current.state, body.state) if body.state is not None
                    else {}}

        row = await self._resource(thread_id, agent_name).patch(pre, values)
        self._event("updated", thread_id, agent_name, row.revision)
        return to_out(row)

    async def delete(self, thread_id: str, agent_name: str, pre: Preconditions) -> None:
        await self._thread_for_change(thread_id)
        revision = await self._resource(thread_id, agent_name).delete(pre, {"state": {}},
                                                                     utcnow())
        self._event("deleted", thread_id, agent_name, revision)

    async def list_thread(self, thread_id: str, *, limit: int,
                          cursor: str | None) -> tuple[list[AgentStateOut], str | None]:
        """One thread's states by agent_name; 404 if the thread does not exist."""
        await self.threads.get(thread_id)
        return await self.query(limit=limit, cursor=cursor, thread_id=thread_id)

    async def query(self, *, limit: int, cursor: str | None, thread_id: str | None = None,
                    agent_name: str | None = None,
                    state_contains: dict[str, Any] | None = None,
                    ) -> tuple[list[AgentStateOut], str | None]:
        """Across threads, sorted by (thread_id, agent_name)."""
        rows = await self.repo.list(
            limit=limit + 1, after=decode_name_cursor(CURSOR, cursor, 2), thread_id=thread_id,
            agent_name=agent_name, state_contains=state_contains,
        )
        page, next_cursor = split_page(CURSOR, rows, limit,
                                       lambda row: [row.thread_id, row.agent_name])
        return [to_out(row) for row in page], next_cursor
