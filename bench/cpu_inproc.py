"""Application CPU per request, in-process: the ASGI application `agentstate serve` builds
(posture included) called directly, no server or sockets, for the get thread, state replace
and append, against bench/minimal_app.py's bare get thread called the same way, on one
Postgres database. A quick A/B of the application's own work between builds; bench.cpu (real
uvicorn servers) is the measure docs/PERFORMANCE.md reports.

    .venv/bin/python -m bench.cpu_inproc [--requests 400] [--rounds 10] [--profile OP] [--calls]
                                         [--store] [--checkpoints] [--messages] [--lists]

`--store` adds the store's get, put and a filtered search (`store_get`, `store_put`,
`store_search`); `--checkpoints` adds AgentStateSaver's read of the latest checkpoint by
digest (`cp_latest`) and a LangGraph step's checkpoint batch (`cp_batch`); `--messages` a
page of a thread's newest 20 messages (`messages_page`); `--lists` a page of the tenant's
newest 20 threads (`threads_list`).

CPU is this process's time.process_time() over the requests (Postgres runs elsewhere), four
requests in flight at a time as bench.cpu's four connections. `--profile OP` runs OP under
cProfile instead and prints its top functions; `--calls` counts the function calls a
request makes (sys.setprofile), a measure the machine's load does not move, and the objects
it leaves in reference cycles (none: each would wait for the cycle collector).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import time
from typing import Any

from bench.server import create_postgres_database, drop_postgres_database, libpq_dsn, migrate

HOST = b"127.0.0.1:8000"
STORE_ITEMS = 100  # store items of each slot's namespace (the store_* operations)
MESSAGES = 40  # messages of each slot's thread with --messages


async def call(app: Any, method: str, path: str, body: bytes | None = None,
               headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[bytes, bytes],
                                                                         bytes]:
    path, _, query = path.partition("?")
    head = [(b"host", HOST), *(headers or [])]
    if body is not None:
        head += [(b"content-type", b"application/json"),
                 (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": head, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
             "state": {}}
    sent = False
    status, out_headers, chunks = 0, {}, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers.update(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)


async def lifespan(app: Any) -> Any:
    """Start `app`'s lifespan; returns the coroutine's queue pair to end it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                    "state": {}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    message = await outbox.get()
    assert message["type"] == "lifespan.startup.complete", message

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task

    return stop


class Slot:
    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.revision = 1
        self.counter = 0
        self.steps = 0  # checkpoints of the thread's chain (cp_batch)


async def setup(app: Any, run: str, index: int, store: bool = False,
                checkpoints: bool = False, messages: bool = False) -> Slot:
    slot = Slot(f"inproc-{run}-{index}")
    body = json.dumps({"thread_id": slot.thread, "state": {"status": "running", "step": 0}})
    status, _, payload = await call(app, "POST", "/v1/threads", body.encode())
    assert status == 201, payload
    for key in range(STORE_ITEMS if store else 0):  # the slot's namespace: 1 item in 10 tagged
        item = json.dumps({"value": {"text": f"memory {key}", "tag": f"t{key % 10}"}})
        status, _, payload = await call(app, "PUT", f"/v1/store/items/{slot.thread}/k{key}",
                                        item.encode())
        assert status == 201, payload
    for n in range(MESSAGES if messages else 0):  # a conversation, for messages_page
        status, _, payload = await call(app, "POST", f"/v1/threads/{slot.thread}/messages",
                                        json.dumps({"role": "user", "content": f"m{n}",
                                                    "item": {"n": n}}).encode())
        assert status == 201, payload
    if checkpoints:  # a first checkpoint, for cp_latest
        status, _, payload = await call(app, "POST", f"/v1/threads/{slot.thread}/checkpoints/"
                                        "batch", checkpoint_step(slot))
        assert status == 200, payload
    return slot


def request(op: str, slot: Slot) -> tuple[str, str, bytes | None, list[tuple[bytes, bytes]]]:
    slot.counter += 1
    if op in ("get_thread", "floor"):
        return "GET", f"/v1/threads/{slot.thread}", None, []
    if op == "threads_list":  # the newest 20 threads of the tenant, one page
        return "GET", "/v1/threads?limit=20", None, []
    if op == "messages_page":  # AgentStateSession.get_items(20): the newest 20, one page
        return "GET", f"/v1/threads/{slot.thread}/messages?order=desc&limit=20&fields=item", None, []
    if op == "cp_latest":  # AgentStateSaver's aget_tuple
        return "GET", f"/v1/threads/{slot.thread}/checkpoints/latest?items=digests", None, []
    if op == "cp_batch":  # a LangGraph step: a checkpoint and a task's pending writes
        return "POST", f"/v1/threads/{slot.thread}/checkpoints/batch", checkpoint_step(slot), []
    if op == "store_get":
        return "GET", f"/v1/store/items/{slot.thread}/k{slot.counter % STORE_ITEMS}", None, []
    if op == "store_put":
        body = json.dumps({"value": {"text": f"memory {slot.counter}", "tag": "t1"}}).encode()
        return "PUT", f"/v1/store/items/{slot.thread}/k{slot.counter % STORE_ITEMS}", body, [
            (b"if-none-match", b'"0"')]  # create or replace, as AgentStateStore's put
    if op == "store_search":
        body = json.dumps({"namespace_prefix": [slot.thread], "filter": {"tag": "t3"},
                           "limit": 10}).encode()
        return "POST", "/v1/store/items/search", body, []
    if op == "state_replace":
        body = json.dumps({"state": {"status": "running", "step": slot.counter}}).encode()
        return "PUT", f"/v1/threads/{slot.thread}", body, [(b"if-match",
                                                            f'"{slot.revision}"'.encode())]
    body = json.dumps({"role": "user", "content": f"message {slot.counter}"}).encode()
    return "POST", f"/v1/threads/{slot.thread}/messages", body, []


def checkpoint_step(slot: Slot) -> bytes:
    """The body of a `POST .../checkpoints/batch` as AgentStateSaver sends a step: the next
    checkpoint of the slot's chain (one channel's new value) and a task's write against it."""
    slot.steps += 1
    step = slot.steps
    parent = f"c{step - 1:08d}" if step > 1 else None
    checkpoint_id, version = f"c{step:08d}", f"{step:016d}.{slot.thread[-6:]}"
    value = base64.b64encode(json.dumps({"step": step, "note": "x" * 200}).encode())
    return json.dumps({
        "checkpoints": [{
            "checkpoint_id": checkpoint_id, "parent_checkpoint_id": parent,
            "checkpoint": {"v": 4, "id": checkpoint_id, "ts": "2026-12-05T00:00:00+00:00",
                           "channel_versions": {"state": version}, "versions_seen": {}},
            "metadata": {"source": "loop", "step": step},
            "values": [{"channel": "state", "version": version, "type": "json",
                        "data": value.decode()}]}],
        "writes": [{"checkpoint_id": checkpoint_id, "task_id": f"task-{step}",
                    "writes": [{"idx": 0, "channel": "state", "type": "json",
                                "data": value.decode()}]}]}).encode()


async def load(app: Any, op: str, slots: list[Slot], count: int, warm: int = 5) -> float:
    """CPU microseconds per request over `count` requests, len(slots) in flight."""
    expect = 201 if op == "append_1" else 200  # every other operation answers 200

    async def worker(slot: Slot, n: int) -> None:
        for _ in range(n):
            method, path, body, headers = request(op, slot)
            status, out, payload = await call(app, method, path, body, headers)
            assert status == expect, (status, payload[:300])
            if op == "state_replace":
                slot.revision = int(out[b"etag"].strip(b'"'))

    per = count // len(slots)
    await asyncio.gather(*(worker(slot, warm) for slot in slots))  # warm-up
    started = time.process_time()
    await asyncio.gather(*(worker(slot, per) for slot in slots))
    return (time.process_time() - started) / (per * len(slots)) * 1e6


async def calls(app: Any, op: str, slots: list[Slot], count: int = 200) -> tuple[float, float]:
    """Function calls per request over `count` requests (after a warm-up), and the objects
    they left in reference cycles, per request: those wait for Python's cycle collector,
    which runs after every 700 net allocations and at its oldest generation walks the heap."""
    import gc
    import sys

    await load(app, op, slots, 40)
    counted = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal counted
        if event in ("call", "c_call"):
            counted += 1

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    sys.setprofile(profile)
    try:
        await load(app, op, slots, count, warm=0)
    finally:
        sys.setprofile(None)
        gc.collect()
        gc.set_debug(0)
    cyclic = len(gc.garbage)
    gc.garbage.clear()
    return counted / count, cyclic / count


async def main_async(args: argparse.Namespace, url: str) -> None:
    if True:
        dsn = libpq_dsn(url)
        os.environ["AGENTSTATE_DATABASE_URL"] = url
        os.environ["AGENTSTATE_AUTO_MIGRATE"] = "false"
        os.environ["AGENTSTATE_LOG_LEVEL"] = "WARNING"
        os.environ["AGENTSTATE_BENCH_DSN"] = dsn
        from app.main import serve_app
        from bench import minimal_app

        ours, floor = serve_app(), minimal_app.create_app()
        stop_ours, stop_floor = await lifespan(ours), await lifespan(floor)
        try:
            run = time.strftime("%H%M%S")
            slots = [await setup(ours, run, i, store=bool(args.store),
                                 checkpoints=bool(args.checkpoints),
                                 messages=bool(args.messages)) for i in range(4)]
            # state replace on threads of its own: an append moves the thread's revision.
            own = [await setup(ours, run + "r", i) for i in range(4)]
            ops = ["get_thread", "floor", "state_replace", "append_1", *args.store,
                   *args.checkpoints, *args.messages, *args.lists]
            if args.calls:
                print("Python function calls per request (calls into Python and C functions, "
                      "counted by sys.setprofile: the interpreter's work, free of the noise "
                      "of a shared machine), and objects a request left in reference cycles:")
                for op in ops:
                    app = floor if op == "floor" else ours
                    made, cyclic = await calls(app, op, own if op == "state_replace" else slots)
                    print(f"{op:14} {made:8.0f} calls {cyclic:6.1f} in cycles")
                return
            if args.profile:
                import cProfile
                import pstats

                app = floor if args.profile == "floor" else ours
                slots = own if args.profile == "state_replace" else slots
                await load(app, args.profile, slots, 200)
                profiler = cProfile.Profile()
                profiler.enable()
                await load(app, args.profile, slots, args.requests)
                profiler.disable()
                stats = pstats.Stats(profiler)
                stats.sort_stats(args.sort).print_stats(args.top)
                if os.environ.get("BENCH_CALLERS"):
                    stats.print_callers(os.environ["BENCH_CALLERS"])
                return
            samples: dict[str, list[float]] = {op: [] for op in ops}
            for _ in range(args.rounds):
                for op in ops:
                    app = floor if op == "floor" else ours
                    samples[op].append(await load(
                        app, op, own if op == "state_replace" else slots, args.requests))
        finally:
            await stop_ours()
            await stop_floor()
    # The ratio to the floor of the same round: both ran within a second of each other, so
    # a busy neighbour slows both (the absolute figures swing 2x on a shared machine).
    for op, values in samples.items():
        ratios = [value / floor for value, floor in zip(values, samples["floor"])]
        print(f"{op:14} {statistics.median(values):7.0f} us "
              f"({min(values):.0f}-{max(values):.0f})  ratio to the floor: median "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--profile")
    parser.add_argument("--calls", action="store_true")
    parser.add_argument("--store", action="store_const", default=[],
                        const=["store_get", "store_put", "store_search"],
                        help="also the store's get, put and a filtered search (10 of 100)")
    parser.add_argument("--messages", action="store_const", default=[],
                        const=["messages_page"],
                        help="also a page of the newest 20 of a thread's 40 messages (as "
                             "AgentStateSession.get_items(20) reads)")
    parser.add_argument("--lists", action="store_const", default=[],
                        const=["threads_list"],
                        help="also a page of the newest 20 threads")
    parser.add_argument("--checkpoints", action="store_const", default=[],
                        const=["cp_latest", "cp_batch"],
                        help="also AgentStateSaver's read (latest, by digest) and a step's "
                             "checkpoint batch")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    url = create_postgres_database()
    try:
        migrate(url)
        asyncio.run(main_async(parser.parse_args(), url))
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()
