"""Framework ids map reversibly onto the name rules, and the server accepts every mapped id."""

from __future__ import annotations

import random
import re
import uuid

import pytest
from agentstate_client import AgentStateClient
from agentstate_client.ids import decode_id, encode_id, join_ids, split_ids

from app.core.schemas import NAME_PATTERN

SAMPLES = [
    "3f2b1c9e-8d7a-4f6b-9c2d-1e0f5a6b7c8d",
    "user/42/chat",
    "a@b",
    "@40",
    ".hidden",
    "..",
    "x y\tz",
    "ünïcødé/日本",
    "emoji 🤖",
    "100%",
    ":",
    "a:b",
    "\x00nul",
    "-",
]


def _random_strings(count: int) -> list[str]:
    rng = random.Random(20261130)
    alphabet = "aZ09._:@-/ %é日\x00🤖"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(count)]


@pytest.mark.parametrize("value", SAMPLES + _random_strings(300))
def test_encode_is_reversible_and_follows_the_name_rules(value: str) -> None:
    name = encode_id(value)
    assert re.fullmatch(NAME_PATTERN, name), name
    assert decode_id(name) == value


def test_names_that_follow_the_rules_map_to_themselves() -> None:
    for value in ["3f2b1c9e-8d7a-4f6b-9c2d-1e0f5a6b7c8d", "thr_01J", "a.b:c_d-e"]:
        assert encode_id(value) == value
    assert encode_id("user/42/chat") == "user@2F42@2Fchat"


def test_distinct_ids_get_distinct_names() -> None:
    values = set(SAMPLES + _random_strings(2000))
    assert len({encode_id(v) for v in values}) == len(values)


@pytest.mark.parametrize(
    "parts",
    [("app", "user", "session"), ("my:app", "", "s/1"), ("", "", ""), (".a", "b@c", "日本")],
)
def test_joined_ids_split_back(parts: tuple[str, ...]) -> None:
    name = join_ids(*parts)
    assert re.fullmatch(NAME_PATTERN, name), name
    assert split_ids(name) == list(parts)


def test_joined_parts_cannot_collide() -> None:
    assert join_ids("a:b", "c") != join_ids("a", "b:c")


def test_refusals_name_the_problem() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_id("")
    with pytest.raises(ValueError, match="255"):
        encode_id("/" * 100)
    assert encode_id("a" * 255) == "a" * 255
    with pytest.raises(ValueError, match="256 characters"):
        encode_id("a" * 256)
    with pytest.raises(ValueError, match="escape"):
        decode_id("abc@4")


@pytest.mark.slow
def test_the_server_accepts_every_mapped_id(client: AgentStateClient) -> None:
    run = uuid.uuid4().hex[:8]  # the server is shared by the session's client tests
    for sample in SAMPLES:
        value = f"{sample}/{run}"
        name = encode_id(value)
        thread = client.create_thread(thread_id=name, state={})
        assert decode_id(client.get_thread(thread.thread_id).thread_id) == value
