"""`AgentStateSaver.aget_delta_channel_history` (LangGraph's DeltaChannel support) against
langgraph-checkpoint's contract: every scenario runs on the saver and on LangGraph's own
`InMemorySaver` with the same calls, and both must answer the same and what the contract
says. What langgraph's conformance suite (main branch, capability `delta_channel_history`)
checks is covered here in our own scenarios: writes oldest first, the nearest stored value
as the seed, the target's own writes left out, channels walked independently, no seed when
the walk reaches the root, a plain (pre-delta) value as a seed with the writes stored at it.
In-process (httpx over ASGI to the app on each backend), so not `slow`."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.langgraph import AgentStateSaver
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from tests.client.conftest import Counting

pytestmark = pytest.mark.anyio
_ids = itertools.count()


def new_id() -> str:
    # Checkpoint ids sort as they are made (as LangGraph's uuid6 ids do).
    return f"{next(_ids):012d}"


async def chain(saver: BaseCheckpointSaver[Any], thread: str, steps: int,
                stored: Mapping[int, dict[str, Any]], writes: Mapping[int, list[tuple[str, Any]]],
                *, ns: str = "", parent: RunnableConfig | None = None,
                ids: list[str] | None = None) -> list[RunnableConfig]:
    """`steps` checkpoints, each the parent of the next (from `parent`): step n stores the
    values `stored[n]` (channel -> value, at version n + 1) and gets the pending writes
    `writes[n]`, one task each. The configs, oldest first."""
    configs: list[RunnableConfig] = []
    for step in range(steps):
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        values = stored.get(step, {})
        versions = {channel: f"{step + 1:08d}.{thread[-4:]}" for channel in values}
        checkpoint = Checkpoint(v=1, id=ids[step] if ids else new_id(), ts="",
                                channel_values=dict(values), channel_versions=versions,
                                versions_seen={}, updated_channels=None)
        parent = await saver.aput(config, checkpoint, {"step": step}, versions)
        configs.append(parent)
        for task, write in enumerate(writes.get(step, [])):
            await saver.aput_writes(parent, [write], f"task-{step}-{task}")
    return configs


def plain(history: Mapping[str, Any]) -> dict[str, Any]:
    """A history as comparable across savers: (channel, value) per write, and the seed."""
    return {channel: {"writes": [(w[1], w[2]) for w in entry["writes"]],
                      **({"seed": entry["seed"]} if "seed" in entry else {})}
            for channel, entry in history.items()}


async def both(saver: AgentStateSaver, build: Any, channels: Sequence[str],
               at: int = -1) -> dict[str, Any]:
    """The history at config `at` of the chain `build(saver, thread)` makes, from our saver
    and from InMemorySaver with the same calls; asserted equal."""
    answers = []
    for made in (saver, InMemorySaver()):
        thread = f"delta-{new_id()}"
        configs = await build(made, thread)
        answers.append(plain(await made.aget_delta_channel_history(
            config=configs[at], channels=channels)))
    assert answers[0] == answers[1], answers
    return answers[0]


def snapshot(step: int) -> dict[str, Any]:
    return {"ch": _DeltaSnapshot([f"snap{step}"])}


async def test_writes_oldest_first_back_to_the_nearest_snapshot(saver: AgentStateSaver) -> None:
    # Snapshots at steps 0 and 3 of 7; the head is step 6: its parent is step 5, the walk
    # stops at step 3 (the nearest stored value) and takes the writes of steps 3, 4, 5.
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 7, {0: snapshot(0), 3: snapshot(3)},
                           {n: [("ch", f"w{n}"), ("other", f"o{n}")] for n in range(7)})

    got = await both(saver, build, ["ch"])
    assert got == {"ch": {"writes": [("ch", "w3"), ("ch", "w4"), ("ch", "w5")],
                          "seed": _DeltaSnapshot(["snap3"])}}


async def test_the_target_itself_counts_for_nothing(saver: AgentStateSaver) -> None:
    # The head stores a snapshot and has writes of its own: neither is part of its history
    # (its writes are pending for the next step; its value is what the caller has).
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 4, {0: snapshot(0), 3: snapshot(3)},
                           {n: [("ch", f"w{n}")] for n in range(4)})

    got = await both(saver, build, ["ch"])
    assert got == {"ch": {"writes": [("ch", "w0"), ("ch", "w1"), ("ch", "w2")],
                          "seed": _DeltaSnapshot(["snap0"])}}


async def test_channels_stop_at_their_own_seeds(saver: AgentStateSaver) -> None:
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 6, {1: {"a": _DeltaSnapshot("A")},
                                             3: {"b": _DeltaSnapshot("B")}},
                           {n: [("a", n), ("b", n)] for n in range(6)})

    got = await both(saver, build, ["a", "b", "never"])
    assert got == {"a": {"writes": [("a", 1), ("a", 2), ("a", 3), ("a", 4)],
                         "seed": _DeltaSnapshot("A")},
                   "b": {"writes": [("b", 3), ("b", 4)], "seed": _DeltaSnapshot("B")},
                   "never": {"writes": []}}


async def test_no_seed_when_the_walk_reaches_the_root(saver: AgentStateSaver) -> None:
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 4, {}, {n: [("ch", n)] for n in range(4)})

    assert await both(saver, build, ["ch"]) == {"ch": {"writes": [("ch", 0), ("ch", 1),
                                                                  ("ch", 2)]}}


async def test_a_plain_value_is_a_seed_and_its_own_writes_replay(
        saver: AgentStateSaver) -> None:
    # A thread written before its channel became a DeltaChannel: plain values at steps 0
    # and 1. The nearest (step 1) is the seed; the write stored at it produced step 2, so
    # it is replayed; step 0's is subsumed by the seed.
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 4, {0: {"ch": [10]}, 1: {"ch": [10, 20]}},
                           {0: [("ch", "older")], 1: [("ch", "at-seed")],
                            2: [("ch", "after")], 3: [("ch", "pending")]})

    assert await both(saver, build, ["ch"]) == {
        "ch": {"writes": [("ch", "at-seed"), ("ch", "after")], "seed": [10, 20]}}


async def test_a_fork_walks_its_own_branch(saver: AgentStateSaver) -> None:
    # A trunk of 3, then two branches from its last checkpoint; each branch's head sees
    # the trunk and its own branch, never the other one (the parent chain, not id order).
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        trunk = await chain(made, thread, 3, {0: snapshot(0)},
                            {n: [("ch", f"trunk{n}")] for n in range(3)})
        left = await chain(made, thread, 2, {}, {n: [("ch", f"left{n}")] for n in range(2)},
                           parent=trunk[-1])
        await chain(made, thread, 3, {}, {n: [("ch", f"right{n}")] for n in range(3)},
                    parent=trunk[-1])
        return left

    assert await both(saver, build, ["ch"]) == {"ch": {"writes": [
        ("ch", "trunk0"), ("ch", "trunk1"), ("ch", "trunk2"), ("ch", "left0")],
        "seed": _DeltaSnapshot(["snap0"])}}


async def test_namespaces_are_walked_apart(saver: AgentStateSaver) -> None:
    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        await chain(made, thread, 3, {0: snapshot(0)}, {n: [("ch", f"root{n}")]
                                                       for n in range(3)})
        return await chain(made, thread, 3, {}, {n: [("ch", f"sub{n}")] for n in range(3)},
                           ns="sub:1")

    assert await both(saver, build, ["ch"]) == {"ch": {"writes": [("ch", "sub0"),
                                                                  ("ch", "sub1")]}}


async def test_a_list_seed_stored_item_by_item(saver: AgentStateSaver) -> None:
    # The saver stores a plain list item by item; as a seed it comes back whole.
    log = [{"role": "user", "content": f"message {n}"} for n in range(70)]

    async def build(made: Any, thread: str) -> list[RunnableConfig]:
        return await chain(made, thread, 3, {0: {"ch": log}}, {n: [("ch", n)]
                                                              for n in range(3)})

    assert await both(saver, build, ["ch"]) == {"ch": {"writes": [("ch", 0), ("ch", 1)],
                                                       "seed": log}}


async def test_a_snapshot_of_a_list_is_stored_item_by_item(saver: AgentStateSaver,
                                                          transport: Counting) -> None:
    """A DeltaChannel's snapshot of its messages travels as the list's items: the next
    snapshot sends only what the log gained since, and both read back as snapshots."""
    log = [{"role": "user", "content": f"message {n}"} for n in range(40)]
    transport.bodies.clear()
    thread = f"delta-{new_id()}"
    configs = await chain(saver, thread, 4, {0: {"ch": _DeltaSnapshot(log[:30])},
                                             2: {"ch": _DeltaSnapshot(log)}},
                          {n: [("ch", n)] for n in range(4)})
    sent = [value for body in transport.bodies if body for checkpoint in json.loads(body)["checkpoints"]
            for value in checkpoint["values"]]
    assert [(v["type"], len(v["items"]), "base_version" in v) for v in sent] == [
        ("agentstate.delta-snapshot.list", 30, False),  # the first snapshot: every item
        ("agentstate.delta-snapshot.list", 10, True)]  # the second: what the log gained
    history = await saver.aget_delta_channel_history(config=configs[-1], channels=["ch"])
    assert history["ch"]["seed"] == _DeltaSnapshot(log)
    fresh = AgentStateSaver(base_url="http://unused.invalid", async_client=saver._aclient())
    found = await fresh.aget_tuple(configs[2])
    assert found is not None and found.checkpoint["channel_values"]["ch"] == _DeltaSnapshot(log)


async def test_missing_checkpoints_and_no_channels(saver: AgentStateSaver) -> None:
    configs = await chain(saver, f"delta-{new_id()}", 2, {0: snapshot(0)}, {0: [("ch", 0)]})
    assert await saver.aget_delta_channel_history(config=configs[-1], channels=[]) == {}
    for config in (
            {"configurable": {**configs[-1]["configurable"], "checkpoint_id": "nope"}},
            {"configurable": {"thread_id": f"never-{new_id()}", "checkpoint_ns": ""}}):
        assert await saver.aget_delta_channel_history(config=config, channels=["ch"]) == \
            await InMemorySaver().aget_delta_channel_history(config=config, channels=["ch"])
    # Without a checkpoint id: the newest checkpoint of the namespace.
    latest = {"configurable": {"thread_id": configs[-1]["configurable"]["thread_id"]}}
    assert plain(await saver.aget_delta_channel_history(config=latest, channels=["ch"])) == {
        "ch": {"writes": [("ch", 0)], "seed": _DeltaSnapshot(["snap0"])}}


async def test_one_request_however_long_the_chain(saver: AgentStateSaver,
                                                  transport: Counting) -> None:
    # BaseCheckpointSaver's own walk reads the chain one checkpoint per request.
    configs = await chain(saver, f"delta-{new_id()}", 60, {0: snapshot(0)},
                          {n: [("ch", n)] for n in range(60)})
    transport.seen.clear()
    got = await saver.aget_delta_channel_history(config=configs[-1], channels=["ch", "x"])
    assert [w[2] for w in got["ch"]["writes"]] == list(range(59))
    assert len(transport.seen) == 1 and transport.seen[0].endswith("/delta-history")


async def test_http_answers(api: AsyncAgentStateClient, uid: str) -> None:
    """What the endpoint itself answers: the walk's target, per channel writes and seed,
    404s, and bad channel lists refused."""
    http = api._http
    base = f"/v1/threads/{uid}/checkpoints"
    empty = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                           params={"channel": "ch"})
    assert empty.status_code == 404 and empty.json()["code"] == "not_found"
    saver = AgentStateSaver(base_url="http://unused.invalid", async_client=api)
    ids = [c["configurable"]["checkpoint_id"] for c in await chain(
        saver, uid, 3, {0: snapshot(0)}, {n: [("ch", n)] for n in range(3)})]
    got = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                         params={"channel": ["ch", "ch2"]})
    assert got.status_code == 200, got.text
    body = got.json()
    assert list(body["channels"]) == ["ch", "ch2"] and body["checkpoint_id"] == ids[2]
    assert [w["checkpoint_id"] for w in body["channels"]["ch"]["writes"]] == ids[:2]
    assert body["channels"]["ch"]["seed"]["type"] and body["channels"]["ch2"] == {
        "writes": [], "seed": None, "seed_digest": None}
    assert re.fullmatch("[0-9a-f]{64}", body["channels"]["ch"]["seed_digest"])
    # A channel named twice is walked once; 32 channels (the most) in one walk, each its own.
    twice = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                           params={"channel": ["ch2", "ch", "ch2", "ch"]})
    assert twice.status_code == 200 and twice.json()["channels"] == {
        "ch2": body["channels"]["ch2"], "ch": body["channels"]["ch"]}, twice.text
    wide = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                          params={"channel": [f"c{n}" for n in range(31)] + ["ch"]})
    assert wide.status_code == 200, wide.text
    assert wide.json()["channels"] == {**{f"c{n}": {"writes": [], "seed": None,
                                                    "seed_digest": None}
                                          for n in range(31)}, "ch": body["channels"]["ch"]}
    missing = await http.get(f"http://agentstate.test{base}/nope/delta-history",
                             params={"channel": "ch"})
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"
    for bad in ({}, {"channel": ""}, {"channel": [f"c{n}" for n in range(33)]}):
        refused = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                                 params=bad)
        assert refused.status_code == 422, (bad, refused.text)
    # The newest checkpoint with its history along: what the walk of it answers, by digest
    # as asked; without `delta_channel` the field is null.
    along = await http.get(f"http://agentstate.test{base}/latest",
                           params={"delta_channel": ["ch", "ch2"], "items": "digests"})
    walked = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                            params={"channel": ["ch", "ch2"], "items": "digests"})
    assert along.status_code == 200, along.text
    assert along.json()["checkpoint_id"] == ids[2]
    assert along.json()["delta_history"] == walked.json()["channels"]
    assert walked.json()["channels"]["ch"]["seed"]["digests"]
    alone = await http.get(f"http://agentstate.test{base}/latest")
    assert alone.json()["delta_history"] is None
    assert {k: v for k, v in along.json().items() if k != "delta_history"} == {
        k: v for k, v in (await http.get(f"http://agentstate.test{base}/latest",
                                         params={"items": "digests"})).json().items()
        if k != "delta_history"}
    for bad in ({"delta_channel": ["ch", ""]}, {"delta_channel": [f"c{n}" for n in range(33)]}):
        refused = await http.get(f"http://agentstate.test{base}/latest", params=bad)
        assert refused.status_code == 422, (bad, refused.text)
        # The parameter by its name, also for one of its repeats.
        assert refused.json()["errors"][0]["parameter"] == "delta_channel", refused.text
    # A seed the client names by its digest (`known_seed`) is not sent again: `seed` null,
    # `seed_digest` the same, the writes as before; on both reads. Another digest, or a
    # seed of another channel, changes nothing.
    digest = body["channels"]["ch"]["seed_digest"]
    other = "0" * 64
    for path, params, key in (
            ("/latest/delta-history", {"channel": ["ch", "ch2"]}, "channels"),
            ("/latest", {"delta_channel": ["ch", "ch2"], "items": "digests"}, "delta_history")):
        named = await http.get(f"http://agentstate.test{base}{path}",
                               params={**params, "known_seed": [other, digest]})
        assert named.status_code == 200, named.text
        assert named.json()[key] == {
            "ch": {**body["channels"]["ch"], "seed": None}, "ch2": body["channels"]["ch2"]}
        unknown = await http.get(f"http://agentstate.test{base}{path}",
                                 params={**params, "known_seed": other})
        assert unknown.json()[key]["ch"]["seed"] is not None
    for bad in ({"known_seed": digest[:-1]}, {"known_seed": digest.upper()},
                {"known_seed": [other] * 33}):
        refused = await http.get(f"http://agentstate.test{base}/latest/delta-history",
                                 params={"channel": "ch", **bad})
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["errors"][0]["parameter"] == "known_seed", refused.text
    saver.close()
