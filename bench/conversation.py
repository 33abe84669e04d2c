"""A growing conversation saved turn by turn: agentstate over HTTP against aisuite's
in-process `PostgresStateStore` (baseline (c)), and the scaling of append and page reads with
the length of one thread. Both run one request at a time: they measure latency, not load.
"""

from __future__ import annotations

import time
from statistics import median
from typing import Any

from bench.http1 import Connection
from bench.ops import append, call, dumps, etag_revision, message, run_state

EARLY, LATE = 10, 10  # medians of turns 1-10 and the last 10


def turn_messages(turn: int) -> list[dict[str, Any]]:
    return [message(2 * turn, "user"), message(2 * turn + 1, "assistant")]


def summary(by_turn: list[list[float]]) -> dict[str, Any]:
    """Medians over the first and the last 10 turns of every chat."""
    early = median(t for row in by_turn[:EARLY] for t in row)
    late = median(t for row in by_turn[-LATE:] for t in row)
    return {"early_ms": round(early * 1000, 3), "late_ms": round(late * 1000, 3),
            "growth": round(late / early, 2)}


class AgentStateChat:
    """One turn = one PUT of the run state with the turn's two messages appended in the same
    transaction (API.md section 3), conditional on the revision the last save returned."""

    def __init__(self, conn: Connection, thread: str) -> None:
        self.conn, self.thread, self.revision = conn, thread, 0

    async def save(self, turn: int) -> None:
        headers = ({"if-match": f'"{self.revision}"'} if self.revision
                   else {"if-none-match": "*"})
        response_headers, _ = await call(
            self.conn, "PUT", f"/v1/threads/{self.thread}",
            {"state": run_state(turn), "append_messages": turn_messages(turn)}, headers)
        self.revision = etag_revision(response_headers)

    async def load(self) -> int:
        _, body = await call(self.conn, "GET",
                             f"/v1/threads/{self.thread}?include=messages&messages_limit=1000")
        return len(body["messages"])


def aisuite_installed() -> bool:
    """Baseline (c) needs the bench extra: pip install -e '.[bench]'."""
    try:
        import aisuite.agents  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


class AisuiteChat:
    """aisuite 0.2.0 `PostgresStateStore.save_state`, the way its runner saves a RunState."""

    def __init__(self, dsn: str, thread: str) -> None:
        import psycopg
        from aisuite.agents import PostgresStateStore, RunState

        self.connection = psycopg.connect(dsn)
        self.store = PostgresStateStore(self.connection, create_schema=True)
        self.state = RunState(agent_name="planner", messages=[], status="running")
        self.thread, self.revision = thread, None

    def save(self, turn: int) -> None:
        self.state.messages.extend(turn_messages(turn))
        self.state.metadata = {"step": turn}
        stored = self.store.save_state(self.thread, self.state, revision=self.revision)
        self.revision = stored.revision

    def load(self) -> int:
        return len(self.store.load_state(self.thread).state.messages)

    def close(self) -> None:
        self.connection.close()


async def conversation(base_url: str, dsn: str | None, run_id: str, turns: int,
                       chats: int = 3) -> dict[str, Any]:
    """`chats` conversations side by side, their turns interleaved with aisuite's, so machine
    noise hits both systems alike and every median has `chats` x 10 samples."""
    conn = await Connection(base_url).connect()
    ours = [AgentStateChat(conn, f"chat-{run_id}-{i}") for i in range(chats)]
    theirs = ([AisuiteChat(dsn, f"chat-{run_id}-{i}") for i in range(chats)]
              if dsn and aisuite_installed() else [])
    timings: dict[str, list[list[float]]] = {"agentstate": [], "aisuite": []}
    loads: dict[str, list[float]] = {"agentstate": [], "aisuite": []}
    try:
        for turn in range(1, turns + 1):
            for system, chats_of in (("agentstate", ours), ("aisuite", theirs)):
                row = []
                for chat in chats_of:
                    started = time.perf_counter()
                    await chat.save(turn) if system == "agentstate" else chat.save(turn)
                    row.append(time.perf_counter() - started)
                if row:
                    timings[system].append(row)
        for _ in range(10):
            started = time.perf_counter()
            loaded = await ours[0].load()
            loads["agentstate"].append(time.perf_counter() - started)
            if theirs:
                started = time.perf_counter()
                theirs[0].load()
                loads["aisuite"].append(time.perf_counter() - started)
    finally:
        await conn.close()
        for chat in theirs:
            chat.close()
    result: dict[str, Any] = {"turns": turns, "chats": chats, "messages": loaded}
    for system, by_turn in timings.items():
        if by_turn:
            result[system] = {**summary(by_turn),
                              "load_ms": round(median(loads[system]) * 1000, 3)}
    return result


async def scaling(base_url: str, run_id: str, sizes: list[int], rounds: int
                  ) -> dict[str, Any]:
    """Append one message and read the newest page (10 and 100 messages) on threads of
    different lengths, round-robin so drift hits every size alike."""
    conn = await Connection(base_url).connect()
    samples: dict[tuple[int, str], list[float]] = {}
    try:
        threads = {}
        for size in sizes:
            thread = f"scale-{run_id}-{size}"
            await call(conn, "POST", "/v1/threads", {"thread_id": thread}, expect=(201,))
            await append(conn, thread, size)
            threads[size] = thread
        requests = {
            "append_1": lambda t, i: ("POST", f"/v1/threads/{t}/messages", dumps(message(i))),
            "page_10": lambda t, i: ("GET", f"/v1/threads/{t}/messages?limit=10&order=desc", None),
            "page_100": lambda t, i: ("GET", f"/v1/threads/{t}/messages?limit=100&order=desc",
                                      None),
        }
        for i in range(rounds):
            for size, thread in threads.items():
                for name, build in requests.items():
                    method, path, body = build(thread, i)
                    started = time.perf_counter()
                    status, _, payload = await conn.request(method, path, body)
                    elapsed = time.perf_counter() - started
                    if status not in (200, 201):
                        raise RuntimeError(f"{method} {path} answered {status}: {payload[:200]!r}")
                    if i:  # the first round warms caches
                        samples.setdefault((size, name), []).append(elapsed)
    finally:
        await conn.close()
    return {name: {str(size): round(median(samples[(size, name)]) * 1000, 3) for size in sizes}
            for name in ("append_1", "page_10", "page_100")}
