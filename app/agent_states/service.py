"""Agent states (API.md section 6): one JSON state per agent per thread, under section 2."""

from __future__ import annotations

from typing import Any

from app.agent_states.repository import AgentStateRepository
from app.agent_states.schemas import AgentStateOut, AgentStatePatch, AgentStateReplace
from app.core.errors import NotFound
from app.core.mergepatch import merge_patch
from app.core.pagination import Page, decode_name_cursor, split_page
from app.core.revisions import Preconditions, RevisionedResource
from app.db.base import utcnow
from app.db.unit import UnitOfWork
from app.threads.aggregate import ThreadAggregate, thread_path

CURSOR = "agent_states"


def state_path(thread_id: str, agent_name: str) -> str:
    return f"{thread_path(thread_id)}/agents/{agent_name}/state"


class AgentStateService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.repo = AgentStateRepository(uow.connection, uow.tenant_id)
        self.threads = ThreadAggregate(uow)

    def _resource(self, thread_id: str, agent_name: str) -> RevisionedResource:
        return RevisionedResource(
            self.repo, (thread_id, agent_name), noun="agent state",
            label=f"Agent state {agent_name!r} of thread {thread_id!r}",
            required=self.settings.require_preconditions,
        )

    def _event(self, change: str, thread_id: str, agent_name: str, revision: int) -> None:
        self.uow.record(f"agent_state.{change}", state_path(thread_id, agent_name),
                        revision=revision, thread_id=thread_id)

    async def _thread_for_change(self, thread_id: str) -> None:
        """PATCH and DELETE never create the thread. A tombstoned thread is 410; a missing one
        is left to section 2 (412 with If-Match, else 404), as for any missing state."""
        try:
            await self.threads.for_child_write(thread_id, create=False)
        except NotFound:
            pass

    async def get(self, thread_id: str, agent_name: str) -> AgentStateOut:
        return AgentStateOut.from_row(await self._resource(thread_id, agent_name).get())

    async def replace(self, thread_id: str, agent_name: str, body: AgentStateReplace,
                      pre: Preconditions) -> tuple[AgentStateOut, bool]:
        """PUT: returns the state and whether it was created. Creates the thread if needed;
        if the request then fails, the transaction takes the thread back with it."""
        thread = await self.threads.for_child_write(thread_id)
        row, created = await self._resource(thread_id, agent_name).put(
            pre,
            lambda current: {"state": body.state} if current is not None
            else {"state": body.state, "thread_pk": thread.id},
            utcnow(),
        )
        self._event("created" if created else "updated", thread_id, agent_name, row.revision)
        return AgentStateOut.from_row(row), created

    async def patch(self, thread_id: str, agent_name: str, body: AgentStatePatch,
                    pre: Preconditions) -> AgentStateOut:
        await self._thread_for_change(thread_id)

        def values(current: Any) -> dict[str, Any]:
            if "state" not in body.model_fields_set:
                return {}
            # `"state": null` removes the member (RFC 7396); for state that means "empty".
            return {"state": merge_patch(current.state, body.state) if body.state is not None
                    else {}}

        row = await self._resource(thread_id, agent_name).patch(pre, values)
        self._event("updated", thread_id, agent_name, row.revision)
        return AgentStateOut.from_row(row)

    async def delete(self, thread_id: str, agent_name: str, pre: Preconditions) -> None:
        await self._thread_for_change(thread_id)
        revision = await self._resource(thread_id, agent_name).delete(pre, {"state": {}},
                                                                     utcnow())
        self._event("deleted", thread_id, agent_name, revision)

    async def list_thread(self, thread_id: str, *, limit: int,
                          cursor: str | None) -> Page[AgentStateOut]:
        """One thread's states by agent_name; 404 if the thread does not exist."""
        await self.threads.live_pk(thread_id)
        return await self.query(limit=limit, cursor=cursor, thread_id=thread_id)

    async def query(self, *, limit: int, cursor: str | None, thread_id: str | None = None,
                    agent_name: str | None = None,
                    state_contains: dict[str, Any] | None = None) -> Page[AgentStateOut]:
        """Across threads, sorted by (thread_id, agent_name)."""
        rows = await self.repo.page(
            limit=limit + 1, after=decode_name_cursor(CURSOR, cursor, 2), thread_id=thread_id,
            agent_name=agent_name, state_contains=state_contains,
        )
        return split_page(CURSOR, rows, limit, lambda row: [row.thread_id, row.agent_name],
                          AgentStateOut.from_row, max_bytes=self.settings.max_page_bytes)
