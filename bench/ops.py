"""The operations the bench measures, written against the HTTP contract (docs/API.md).

Each connection of the load generator works on its own thread, so writes measure the server
and the database, not contention on one row. `setup` runs before the clock starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bench.http1 import Connection, HttpError

TEXT = ("The agent looked at the failing test, read the stack trace and decided the cursor "
        "encoding was at fault; it proposes to add the unique column to the keyset and to "
        "write a regression test that pages through rows sharing one timestamp. ") * 2
TEXT = TEXT[:300]


def message(i: int, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": f"{i}: {TEXT}"}


def run_state(step: int) -> dict[str, Any]:
    """A small run state like an agent framework keeps (aisuite's RunState without messages)."""
    return {"agent_name": "planner", "status": "running", "step": step, "max_turns": 50,
            "tags": ["bench", "planner"], "run_name": "nightly triage",
            "trace_id": "trace-7f3a9c", "metadata": {"model": "gpt-x", "temperature": 0.2}}


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def etag_revision(headers: dict[bytes, bytes]) -> int:
    return int(headers[b"etag"].strip(b'"'))


async def call(conn: Connection, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None, expect: tuple[int, ...] = (200, 201)
               ) -> tuple[dict[bytes, bytes], Any]:
    """A setup request that must succeed."""
    status, response_headers, payload = await conn.request(
        method, path, None if body is None else dumps(body), headers)
    if status not in expect:
        raise HttpError(f"{method} {path} answered {status}: {payload[:300]!r}")
    return response_headers, json.loads(payload) if payload else None


async def append(conn: Connection, thread: str, count: int) -> list[str]:
    """Append `count` messages in batches of 100; their ids in order."""
    ids: list[str] = []
    while len(ids) < count:
        n = min(100, count - len(ids))
        _, body = await call(conn, "POST", f"/v1/threads/{thread}/messages",
                             {"messages": [message(len(ids) + k) for k in range(n)]})
        ids.extend(m["id"] for m in body["data"])
    return ids


@dataclass
class Slot:
    """What one connection knows between its requests."""

    thread: str
    revision: int = 0
    counter: int = 0
    ids: list[str] = field(default_factory=list)


class Op:
    name = ""
    expect: tuple[int, ...] = (200,)
    #: Operations that use up prepared rows stop when a connection's supply is gone.
    finite = False

    def __init__(self, run_id: str, params: dict[str, Any]) -> None:
        self.run_id = run_id
        self.params = params

    def thread_id(self, index: int) -> str:
        return f"bench-{self.run_id}-{self.name}-{index}"

    async def setup(self, conn: Connection, index: int) -> Slot:
        thread = self.thread_id(index)
        headers, _ = await call(conn, "POST", "/v1/threads",
                                {"thread_id": thread, "state": run_state(0)}, expect=(201,))
        return Slot(thread, etag_revision(headers))

    def build(self, slot: Slot) -> tuple[str, str, bytes | None, dict[str, str] | None]:
        raise NotImplementedError

    def done(self, slot: Slot, headers: dict[bytes, bytes]) -> None:
        slot.counter += 1

    def exhausted(self, slot: Slot) -> bool:
        return False


class CreateThread(Op):
    name = "create_thread"
    expect = (201,)

    async def setup(self, conn: Connection, index: int) -> Slot:
        return Slot(self.thread_id(index))

    def build(self, slot):
        body = {"thread_id": f"{slot.thread}-{slot.counter}", "state": run_state(0),
                "metadata": {"team": "bench"}}
        return "POST", "/v1/threads", dumps(body), None


class StateReplace(Op):
    """PUT of a new state, conditional on the revision the last answer's ETag gave."""

    name = "state_replace"

    def path(self, slot: Slot) -> str:
        return f"/v1/threads/{slot.thread}"

    def build(self, slot):
        return ("PUT", self.path(slot), dumps({"state": run_state(slot.counter)}),
                {"if-match": f'"{slot.revision}"'})

    def done(self, slot, headers):
        slot.counter += 1
        slot.revision = etag_revision(headers)


class AppendOne(Op):
    name = "append_1"
    expect = (201,)

    def build(self, slot):
        return ("POST", f"/v1/threads/{slot.thread}/messages", dumps(message(slot.counter)),
                None)


class AppendBatch(Op):
    name = "append_10"
    expect = (201,)

    def build(self, slot):
        body = {"messages": [message(slot.counter * 10 + k) for k in range(10)]}
        return "POST", f"/v1/threads/{slot.thread}/messages", dumps(body), None


class PageRead(Op):
    name = "page_100"

    async def setup(self, conn, index):
        slot = await super().setup(conn, index)
        await append(conn, slot.thread, 200)
        return slot

    def build(self, slot):
        return "GET", f"/v1/threads/{slot.thread}/messages?limit=100&order=desc", None, None


class GetThread(Op):
    name = "get_thread"

    def build(self, slot):
        return "GET", f"/v1/threads/{slot.thread}", None, None


class GetThreadRow(GetThread):
    """The same GET against bench/minimal_app.py's bare one-SELECT endpoint, on the threads
    the agentstate get_thread run created (same run id)."""

    name = "get_thread_row"

    def thread_id(self, index: int) -> str:
        return f"bench-{self.run_id}-{GetThread.name}-{index}"

    async def setup(self, conn, index):
        return Slot(self.thread_id(index))


class Compaction(Op):
    """Compact 20 live messages into one summary. Each connection prepares
    `compactions_per_connection` runs of 20 before the clock starts."""

    name = "compaction_20"
    expect = (201,)
    finite = True

    async def setup(self, conn, index):
        slot = await super().setup(conn, index)
        runs = int(self.params["compactions_per_connection"])
        slot.ids = await append(conn, slot.thread, 20 * runs)
        return slot

    def build(self, slot):
        sources = slot.ids[slot.counter * 20:(slot.counter + 1) * 20]
        body = {"source_message_ids": sources, "reason": "context window",
                "summary": {"role": "assistant", "content": "Summary: " + TEXT[:200]}}
        return "POST", f"/v1/threads/{slot.thread}/compactions", dumps(body), None

    def exhausted(self, slot):
        return (slot.counter + 1) * 20 > len(slot.ids)


class AgentStateReplace(StateReplace):
    name = "agent_state_replace"

    def path(self, slot: Slot) -> str:
        return f"/v1/threads/{slot.thread}/agents/planner/state"

    async def setup(self, conn, index):
        slot = await super().setup(conn, index)
        headers, _ = await call(conn, "PUT", self.path(slot), {"state": run_state(0)},
                                {"if-none-match": "*"}, expect=(201,))
        slot.revision = etag_revision(headers)
        return slot


class FixedGet(Op):
    """A GET of one path that needs no thread."""

    path = ""

    async def setup(self, conn, index):
        return Slot("")

    def build(self, slot):
        return "GET", self.path, None, None


class EventsPage(FixedGet):
    name, path = "events_page", "/v1/events?limit=100"


class Healthz(FixedGet):
    """agentstate's own HTTP stack with no database and no key (request ids, access log,
    metrics, body limits, routing): the most any agentstate endpoint can reach."""

    name, path = "healthz", "/healthz"


class Hello(FixedGet):
    """Baseline (b): the minimal FastAPI endpoint in bench/minimal_app.py."""

    name, path = "hello", "/hello"


OPS: dict[str, type[Op]] = {op.name: op for op in (
    CreateThread, StateReplace, AppendOne, AppendBatch, PageRead, GetThread, Compaction,
    AgentStateReplace, EventsPage, Healthz, Hello, GetThreadRow,
)}
SERVER_OPS = [name for name in OPS if name not in ("hello", "get_thread_row")]
WRITE_OPS = ["create_thread", "state_replace", "append_1", "append_10", "compaction_20",
             "agent_state_replace"]
