"""The client's thread history and fork methods (`list_revisions`, `iter_revisions`,
`get_revision`, `fork_thread`), blocking and asyncio, against a real server."""

from __future__ import annotations

import asyncio

import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient, NotFound, Thread
from agentstate_client.errors import AlreadyExists, UnprocessableEntity
from agentstate_client.models import ForkedFrom, ThreadRevision

from tests.support import ServerProcess

pytestmark = pytest.mark.slow  # every test here talks to a server process


def test_revisions_and_fork(client: AgentStateClient, uid: str) -> None:
    thread = client.create_thread(f"h-{uid}", state={"step": 1}, metadata={"m": 1})
    client.put_thread(thread.thread_id, {"step": 2}, if_match=1)
    client.append_message(thread.thread_id, "user", "hello")  # revision 3, same state
    page = client.list_revisions(thread.thread_id, limit=1)
    assert [r.revision for r in page.data] == [2] and page.has_more
    revisions = list(client.iter_revisions(thread.thread_id, limit=1))
    assert all(isinstance(r, ThreadRevision) for r in revisions)
    assert [(r.revision, r.state) for r in revisions] == [(2, {"step": 2}), (1, {"step": 1})]
    at3 = client.get_revision(thread.thread_id, 3)
    assert (at3.revision, at3.state_revision, at3.state, at3.metadata) == (
        3, 2, {"step": 2}, {"m": 1})
    with pytest.raises(NotFound):
        client.get_revision(thread.thread_id, 9)

    fork = client.fork_thread(thread.thread_id, f"f-{uid}", revision=1)
    assert isinstance(fork, Thread)
    assert (fork.thread_id, fork.revision, fork.state, fork.message_count) == (
        f"f-{uid}", 1, {"step": 1}, 0)
    now = client.fork_thread(thread.thread_id, f"n-{uid}")
    assert now.state == {"step": 2} and now.message_count == 1
    client.put_thread(now.thread_id, {"only": "fork"}, if_match=now.revision)
    assert client.get_thread(thread.thread_id).state == {"step": 2}, "the fork is independent"
    assert fork.forked_from == ForkedFrom(thread_id=thread.thread_id, revision=1)
    assert client.get_thread(now.thread_id).forked_from == ForkedFrom(thread.thread_id, 3)
    assert client.get_thread(thread.thread_id).forked_from is None
    forks = client.list_threads(forked_from=thread.thread_id)
    assert [t.thread_id for t in forks.data] == [f"n-{uid}", f"f-{uid}"]
    with pytest.raises(AlreadyExists):
        client.fork_thread(thread.thread_id, f"n-{uid}")
    with pytest.raises(UnprocessableEntity) as refused:
        client.fork_thread(thread.thread_id, f"x-{uid}", revision=99)
    assert refused.value.errors[0]["code"] == "revision_not_kept"


def test_async_revisions_and_fork(server: ServerProcess, uid: str) -> None:
    async def scenario() -> None:
        async with AsyncAgentStateClient(server.base_url) as client:
            await client.create_thread(f"ah-{uid}", state={"v": 1})
            await client.put_thread(f"ah-{uid}", {"v": 2}, if_match=1)
            seen = [r.revision async for r in client.iter_revisions(f"ah-{uid}")]
            assert seen == [2, 1]
            assert (await client.get_revision(f"ah-{uid}", 1)).state == {"v": 1}
            fork = await client.fork_thread(f"ah-{uid}", f"af-{uid}", revision=1)
            assert fork.state == {"v": 1}

    asyncio.run(scenario())
