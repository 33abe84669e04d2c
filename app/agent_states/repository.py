"""Agent-state rows. Every statement is scoped by tenant; revisions change only inside SQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, insert, literal, select, tuple_

from app.agent_states.models import AgentState
from app.db.base import AnyRow, table
from app.db.dialect import json_contains
from app.db.revisioned import RevisionedRepository


class AgentStateRepository(RevisionedRepository):
    table = table(AgentState)
    key_columns = ("thread_id", "agent_name")

    async def page(self, *, limit: int, after: tuple[str, ...] | None, thread_id: str | None,
                   agent_name: str | None, state_contains: dict[str, Any] | None) -> list[AnyRow]:
        """Live agent states in (thread_id, agent_name) order, keyset-paged on that pair."""
        t = self.table
        stmt = select(t).where(self._live())
        if thread_id is not None:
            stmt = stmt.where(t.c.thread_id == thread_id)
        if agent_name is not None:
            stmt = stmt.where(t.c.agent_name == agent_name)
        if state_contains:
            stmt = stmt.where(json_contains(self.connection, t.c.state, state_contains))
        if after is not None:
            stmt = stmt.where(tuple_(t.c.thread_id, t.c.agent_name) > tuple_(*after))
        stmt = stmt.order_by(t.c.thread_id, t.c.agent_name).limit(limit)
        return list((await self.connection.execute(stmt)).all())

    async def copy(self, source_pk: int, target_pk: int, target_thread_id: str,
                   now: datetime) -> list[str]:
        """Copy a thread's live agent states into another thread, each as a new resource
        (revision 1); returns their agent names."""
        t = self.table
        copied = await self.connection.execute(
            insert(t).from_select(
                ["tenant_id", "thread_pk", "thread_id", "agent_name", "revision", "state",
                 "created_at", "updated_at"],
                select(t.c.tenant_id, literal(target_pk, BigInteger),
                       literal(target_thread_id, t.c.thread_id.type), t.c.agent_name,
                       literal(1, BigInteger), t.c.state, literal(now, t.c.created_at.type),
                       literal(now, t.c.updated_at.type))
                .where(self._live(), t.c.thread_pk == source_pk)
                .order_by(t.c.agent_name),
            ).returning(t.c.agent_name)
        )
        return sorted(copied.scalars())
