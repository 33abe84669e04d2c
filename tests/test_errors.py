"""Bad input gets the documented 4xx problem+json, never a 500 (API.md section 1)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


def assert_problem(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert {"type", "title", "status", "detail", "instance", "code"} <= body.keys()
    assert "Traceback" not in response.text and "SELECT" not in response.text.upper()
    if code:
        assert body["code"] == code, body
    return body


@pytest.mark.parametrize("raw", [b"{", b"{'a': 1}", b'{"state": NaN}', b'{"a": Infinity}',
                                 b"\xff\xfe", b'{"state": {}} trailing'])
async def test_malformed_json_is_400(client: httpx.AsyncClient, raw: bytes) -> None:
    assert_problem(await client.post("/v1/threads", content=raw, headers=JSON), 400, "invalid_json")


@pytest.mark.parametrize("body, pointer", [
    ({"state": []}, "/state"),
    ({"state": "x"}, "/state"),
    ({"metadata": 5}, "/metadata"),
    ({"thread_id": 5}, "/thread_id"),
])
async def test_wrong_types_are_422_with_pointers(client: httpx.AsyncClient, body: dict,
                                                 pointer: str) -> None:
    problem = assert_problem(await client.post("/v1/threads", json=body), 422, "validation_failed")
    assert [e["pointer"] for e in problem["errors"]] == [pointer]


async def test_body_must_be_an_object(client: httpx.AsyncClient, uid: str) -> None:
    assert_problem(await client.post("/v1/threads", json=[1, 2]), 422)
    assert_problem(await client.put(f"/v1/threads/{uid}", json={}), 422)  # state is required


async def test_unknown_member_is_named(client: httpx.AsyncClient) -> None:
    problem = assert_problem(await client.post("/v1/threads", json={"stat": {}}), 422,
                             "unknown_field")
    assert [(e["pointer"], e["code"]) for e in problem["errors"]] == [("/stat", "unknown_field")]
    assert "/stat" in problem["detail"]


@pytest.mark.parametrize("bad", [".hidden", "a/b", "sp ace", "x" * 256, "ünï", "a%2Fb"])
async def test_bad_names(client: httpx.AsyncClient, bad: str) -> None:
    assert_problem(await client.post("/v1/threads", json={"thread_id": bad}), 422)
    response = await client.put(f"/v1/threads/{httpx.URL(path=bad).raw_path.decode()}",
                                json={"state": {}})
    assert response.status_code in (404, 422), response.text
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("good", ["a", "A.b_c:d@e-f", "x" * 255, "0"])
async def test_good_names(client: httpx.AsyncClient, good: str, uid: str) -> None:
    name = good if len(good) == 255 else f"{good}{uid}"
    assert (await client.put(f"/v1/threads/{name}", json={"state": {}},
                             headers={"If-None-Match": "*"})).status_code in (201, 412)


async def test_oversize_body_is_413(client: httpx.AsyncClient) -> None:
    big = b'{"state": {"x": "' + b"a" * 1_048_600 + b'"}}'
    assert_problem(await client.post("/v1/threads", content=big, headers=JSON), 413,
                   "payload_too_large")

    async def chunks():
        yield b'{"state": {"x": "'
        for _ in range(20):
            yield b"a" * 60_000
        yield b'"}}'

    # No Content-Length: the bytes are counted as they arrive.
    assert_problem(await client.post("/v1/threads", content=chunks(), headers=JSON), 413)


async def test_body_at_the_limit_is_accepted(client: httpx.AsyncClient, uid: str) -> None:
    prefix = f'{{"thread_id": "big-{uid}", "state": {{"x": "'.encode()
    body = prefix + b"a" * (1_048_576 - len(prefix) - 3) + b'"}}'
    assert len(body) == 1_048_576
    assert (await client.post("/v1/threads", content=body, headers=JSON)).status_code == 201


async def test_nesting_depth(client: httpx.AsyncClient, uid: str) -> None:
    def nested(depth: int) -> bytes:  # the body object counts as 1
        return b'{"state":' + b'{"a":' * (depth - 2) + b"{}" + b"}" * (depth - 1)

    ok = await client.post("/v1/threads", content=nested(64), headers=JSON)
    assert ok.status_code == 201, ok.text
    problem = assert_problem(await client.post("/v1/threads", content=nested(65), headers=JSON), 422)
    assert problem["errors"][0]["code"] == "json_too_deep"
    # Far too deep for a recursive parser: still a clean 422.
    assert_problem(await client.post("/v1/threads", content=b"[" * 200_000 + b"]" * 200_000,
                                     headers=JSON), 422)
    # Brackets inside strings are not nesting.
    text = '{"state": {"s": "' + "[{" * 100 + '"}}'
    assert (await client.post("/v1/threads", content=text, headers=JSON)).status_code == 201


async def test_unstorable_strings(client: httpx.AsyncClient) -> None:
    for raw in (rb'{"state": {"a": "\u0000"}}', rb'{"state": {"a": "\ud800"}}'):
        assert_problem(await client.post("/v1/threads", content=raw, headers=JSON), 422)
    emoji = await client.post("/v1/threads", content=rb'{"state": {"a": "\ud83d\ude00 \u00e9"}}',
                              headers=JSON)
    assert emoji.status_code == 201 and emoji.json()["state"]["a"] == "\U0001F600 é"


async def test_not_json_content_type_is_415(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/threads", content=b'{"state": {}}',
                                 headers={"content-type": "text/plain"})
    assert_problem(response, 415, "unsupported_media_type")


async def test_bad_if_match_header_is_400(client: httpx.AsyncClient, uid: str) -> None:
    response = await client.put(f"/v1/threads/{uid}", json={"state": {}},
                                headers={"If-Match": "3"})
    assert_problem(response, 400, "invalid_header")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/nothing-here"), 404)
    assert_problem(await client.post("/v1/threads/x"), 405)
