"""Graceful shutdown: on SIGTERM (what `podman stop` sends) a real `agentstate serve` stops
accepting connections and lets the requests already in flight finish.

The in-flight request is made slow honestly: the test holds a write lock on the real
database, so the request waits inside its transaction until the test lets go.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, eventually, pool_in_use, write_lock

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def connections_in_use(server: ServerProcess) -> int:
    try:
        text = httpx.get(f"{server.base_url}/metrics", timeout=2).text
    except httpx.TransportError:
        return 0
    return int(pool_in_use(text) or 0)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_in_flight_requests(database_url: str, uid: str, workers: int) -> None:
    thread_id = f"drain-{uid}"
    # The busy timeout must outlast the test's hold on the SQLite write lock.
    server = ServerProcess(database_url, args=("--workers", str(workers)),
                           env={"AGENTSTATE_SQLITE_BUSY_TIMEOUT_MS": "120000"})
    with server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async with write_lock(database_url):
                in_flight = asyncio.create_task(
                    client.post("/v1/threads", json={"thread_id": thread_id, "state": {"n": 1}}))
                # Inside its transaction, waiting on the lock: a pooled connection is in use.
                await eventually(lambda: connections_in_use(server) >= 1,
                                 "the request holds a database connection")
                assert server.process is not None
                server.process.send_signal(signal.SIGTERM)
                # uvicorn's own word that it is past closing the listener and is now waiting
                # for the open request; only then does the test let the request go on.
                await eventually(lambda: "Waiting for connections to close" in server.logs(),
                                 "the server drains")
                # Every worker closes its own listening socket (the supervisor's never
                # listens), so new connections are refused rather than left in a backlog.
                await eventually(lambda: refuses_connections(server.port),
                                 "new connections are refused")
                assert not in_flight.done()
            response = await in_flight
        assert response.status_code == 201, response.text
        assert response.json()["thread_id"] == thread_id
        # A single uvicorn re-raises the SIGTERM once drained, so it ends "killed by SIGTERM"
        # (a clean stop to systemd and podman); the multi-worker supervisor returns 0.
        assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "Traceback" not in server.logs()

    # The drained request was committed, not cut off.
    with ServerProcess(database_url) as after:
        stored = httpx.get(f"{after.base_url}/v1/threads/{thread_id}", timeout=10)
    assert stored.status_code == 200 and stored.json()["state"] == {"n": 1}


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_ends_open_streams_and_long_polls(database_url: str, uid: str,
                                                        workers: int) -> None:
    """Watchers never end by themselves: on SIGTERM the server ends their streams (clients
    resume elsewhere from their cursor) instead of holding its shutdown until the graceful
    timeout and then cutting them off. Both watch a thread nothing writes (the database is
    shared with other tests), so they would wait."""
    server = ServerProcess(database_url, args=("--workers", str(workers),
                                               "--graceful-timeout", "60"))
    quiet = {"thread_id": f"quiet-{uid}"}
    with server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async with client.stream("GET", "/v1/events/stream", params=quiet,
                                     headers={"Accept": "text/event-stream"}) as stream:
                lines = stream.aiter_lines()
                assert await anext(lines) == "retry: 1000"
                poll = asyncio.create_task(client.get("/v1/events",
                                                      params={**quiet, "wait": 50}))
                await asyncio.sleep(0.5)  # the poll is waiting on the feed
                assert server.process is not None
                server.process.send_signal(signal.SIGTERM)
                # Well within the 60 s graceful timeout: the stream ends cleanly and the
                # poll answers (empty), both within the client's 30 s.
                rest = await asyncio.wait_for(_drain(lines), 30)
                answered = await asyncio.wait_for(poll, 30)
        assert all(line in ("", ": keep-alive") for line in rest), rest
        assert answered.status_code == 200 and answered.json()["data"] == []
        assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "timeout graceful shutdown exceeded" not in server.logs()
    assert "Traceback" not in server.logs()


async def _drain(lines: Any) -> list[str]:
    return [line async for line in lines]
