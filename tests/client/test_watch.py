"""`watch()` on both clients: events as they commit, filters, and resuming after the server
restarts (a real `agentstate serve`, killed and started again on the same port)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient, Event

from tests.support import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


async def test_async_watch_resumes_across_a_server_restart(database_url: str,
                                                           uid: str) -> None:
    server = ServerProcess(database_url)
    with server:
        async with AsyncAgentStateClient(server.base_url, backoff=0.05) as client:
            start = (await client.list_events(limit=100)).next_cursor
            while (page := await client.list_events(cursor=start, limit=100)).has_more:
                start = page.next_cursor
            start = page.next_cursor
            seen: list[Event] = []
            watch = client.watch(cursor=start, resource_prefix=f"/v1/threads/w-{uid}")

            async def follow() -> None:
                async for event in watch:
                    seen.append(event)
                    if len(seen) == 6:
                        return

            following = asyncio.create_task(follow())
            for i in range(3):
                await client.create_thread(f"w-{uid}-{i}", state={})
                await client.create_thread(f"other-{uid}-{i}", state={})
            while len(seen) < 3:
                await asyncio.sleep(0.05)
            assert server.process is not None
            server.process.kill()
            server.process.wait()
            await asyncio.to_thread(server.start)
            for i in range(3, 6):
                await client.create_thread(f"w-{uid}-{i}", state={})
            await asyncio.wait_for(following, 60)
            await watch.aclose()
    assert [e.resource for e in seen] == [f"/v1/threads/w-{uid}-{i}" for i in range(6)]
    assert len({e.seq for e in seen}) == 6 and [e.seq for e in seen] == sorted(e.seq for e in seen)
    assert watch.cursor is not None


def test_sync_watch_yields_events_as_they_commit(server: ServerProcess,
                                                 client: AgentStateClient, uid: str) -> None:
    page = client.list_events(limit=100)
    while page.has_more:
        page = client.list_events(cursor=page.next_cursor, limit=100)
    seen: list[Event] = []
    with client.watch(cursor=page.next_cursor, thread_id=f"s-{uid}") as watch:
        def writer() -> None:
            with AgentStateClient(server.base_url) as other:
                other.create_thread(f"s-{uid}", state={})
                other.put_agent_state(f"s-{uid}", "a", {"k": 1})

        thread = threading.Thread(target=writer)
        thread.start()
        for event in watch:
            seen.append(event)
            if len(seen) == 2:
                break
        thread.join()
    assert [e.type for e in seen] == ["thread.created", "agent_state.created"]
    long_polled = client.list_events(cursor=watch.cursor, thread_id=f"s-{uid}", wait=0.2)
    assert long_polled.data == [] and long_polled.next_cursor == watch.cursor
