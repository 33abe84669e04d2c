"""The async client's lean HTTP/1.1 transport (agentstate_client/_http1.py), which a client
built on a plain `http://` URL uses: checked against small servers written here that answer
as HTTP allows (chunked bodies, closed connections, `Connection: close`, silence), against a
proxy from the environment, and against a real server, differentially with httpx's own
transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from agentstate_client import APIConnectionError, APITimeoutError, AsyncAgentStateClient, NotFound
from agentstate_client._http1 import AsyncHTTP1Transport

from tests.support import ServerProcess, cyclic_garbage

pytestmark = pytest.mark.anyio

THREAD = {"thread_id": "t1", "revision": 3, "state": {"step": 1}, "metadata": {},
          "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:01Z",
          "message_count": 0}
BODY = json.dumps(THREAD).encode()

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]


class RawServer:
    """Reads each request's head (these requests have no body) and lets `answer` write the
    response; `answer` returns whether to keep the connection open for another request."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                if not await self.answer(head, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def raw_server(answer: Answer) -> AsyncIterator[tuple[RawServer, str]]:
    state = RawServer(answer)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield state, f"http://127.0.0.1:{port}"


def fixed(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s"
            b"\r\n%s" % (len(body), extra, body))


async def keep_alive(_head: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(fixed())
    return True


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_sequential_requests_share_one_connection() -> None:
    async with raw_server(keep_alive) as (server, url), AsyncAgentStateClient(url) as client:
        for _ in range(5):
            assert (await client.get_thread("t1")).revision == 3
    assert server.connections == 1
    assert all(head.startswith(b"GET /v1/threads/t1 HTTP/1.1\r\n") for head in server.requests)


async def test_concurrent_requests_each_get_their_own_answer() -> None:
    async def echo(head: bytes, writer: asyncio.StreamWriter) -> bool:
        thread_id = head.split(b" ")[1].rsplit(b"/", 1)[1].decode()
        await asyncio.sleep(0.01)  # all of them in flight at once
        writer.write(fixed(json.dumps({**THREAD, "thread_id": thread_id}).encode()))
        return True

    async with raw_server(echo) as (server, url), AsyncAgentStateClient(url) as client:
        names = [f"t{i}" for i in range(20)]
        threads = await asyncio.gather(*(client.get_thread(name) for name in names))
        assert [thread.thread_id for thread in threads] == names
        await asyncio.gather(*(client.get_thread(name) for name in names))
    assert server.connections == 20  # the second round reused the first round's


async def test_connections_at_once_are_bounded_as_in_httpx() -> None:
    """100 at most, as httpx's default limits; the rest wait for one and are answered, at
    least 20 of them on connections kept from the first hundred (httpx's idle limit)."""
    open_now = peak = 0

    async def slow(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        await asyncio.sleep(0.05)
        open_now -= 1
        writer.write(fixed())
        return True

    async with raw_server(slow) as (server, url), AsyncAgentStateClient(url) as client:
        threads = await asyncio.gather(*(client.get_thread("t1") for _ in range(150)))
    assert len(threads) == 150 and all(thread.revision == 3 for thread in threads)
    assert peak == 100
    assert server.connections <= 130


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    async def once(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(fixed())  # keep-alive by HTTP/1.1's default, then closed (a timeout)
        return False

    async with raw_server(once) as (server, url), \
            AsyncAgentStateClient(url, max_retries=0) as client:
        for _ in range(3):
            assert (await client.get_thread("t1")).revision == 3
            await asyncio.sleep(0.05)  # the close reaches the client before the next request
    assert server.connections == 3


async def test_connection_close_is_honoured() -> None:
    async def closing(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(fixed(extra=b"connection: close\r\n"))
        await writer.drain()
        await asyncio.sleep(0.2)  # the server has not closed yet when the next request goes
        return False

    async with raw_server(closing) as (server, url), \
            AsyncAgentStateClient(url, max_retries=0) as client:
        for _ in range(2):
            assert (await client.get_thread("t1")).revision == 3
    assert server.connections == 2


async def test_a_chunked_body_in_pieces() -> None:
    async def chunked(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for start in range(0, len(BODY), 7):
            piece = BODY[start:start + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        return True

    async with raw_server(chunked) as (server, url), AsyncAgentStateClient(url) as client:
        assert (await client.get_thread("t1")).state == {"step": 1}
        assert (await client.get_thread("t1")).state == {"step": 1}
    assert server.connections == 1


async def test_silence_is_a_timeout() -> None:
    async def silent(_head: bytes, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async with raw_server(silent) as (_, url), \
            AsyncAgentStateClient(url, timeout=0.2, max_retries=0) as client:
        with pytest.raises(APITimeoutError):
            await client.get_thread("t1")


async def test_a_body_cut_short_is_a_connection_error() -> None:
    async def cut(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(fixed()[:-10])
        return False

    async with raw_server(cut) as (_, url), AsyncAgentStateClient(url, max_retries=0) as client:
        with pytest.raises(APIConnectionError, match="complete response"):
            await client.get_thread("t1")


async def test_a_malformed_answer_is_a_connection_error() -> None:
    async def garbage(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SPDY/9 what\r\n\r\n")
        return False

    async with raw_server(garbage) as (_, url), \
            AsyncAgentStateClient(url, max_retries=0) as client:
        with pytest.raises(APIConnectionError, match="malformed response"):
            await client.get_thread("t1")


async def test_nobody_listening_is_a_connection_error() -> None:
    async with raw_server(keep_alive) as (_, url):
        pass  # closed: its port refuses connections now
    async with AsyncAgentStateClient(url, max_retries=0) as client:
        with pytest.raises(APIConnectionError):
            await client.get_thread("t1")


async def test_a_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean transport knows no proxies: with one configured, httpx's own is used."""
    async with raw_server(keep_alive) as (proxy, proxy_url):
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        async with AsyncAgentStateClient("http://agentstate.invalid:8080") as client:
            assert (await client.get_thread("t1")).revision == 3
    assert proxy.requests[0].startswith(b"GET http://agentstate.invalid:8080/v1/threads/t1 ")


@pytest.mark.slow
async def test_same_answers_as_httpx_transport_on_a_real_server(server: ServerProcess) -> None:
    """The same calls, one client on each transport, many at once: equal results."""
    lean = AsyncAgentStateClient(server.base_url)
    stock = AsyncAgentStateClient(server.base_url, transport=httpx.AsyncHTTPTransport())
    async with lean, stock:
        async def session(client: AsyncAgentStateClient, name: str) -> list[object]:
            created = await client.create_thread(thread_id=name, state={"n": 0})
            written = await client.append_messages(
                name, [{"role": "user", "content": "x" * 70_000}], if_match=created.revision)
            thread = await client.get_thread(name, include_messages=True)
            missing = None
            try:
                await client.get_thread(f"{name}-missing")
            except Exception as exc:  # noqa: BLE001 - the error itself is compared
                missing = (type(exc).__name__, exc.status_code)  # type: ignore[attr-defined]
            page = await client.list_messages(name)
            return [written.thread_revision, thread.revision, thread.state,
                    [m.content for m in thread.messages or []], missing,
                    [m.content for m in page.data]]

        tag = id(lean)
        ours = await asyncio.gather(*(session(lean, f"h1-{tag}-{i}") for i in range(12)))
        theirs = await asyncio.gather(*(session(stock, f"hx-{tag}-{i}") for i in range(12)))
    assert ours == theirs
    assert ours[0][4] == ("NotFound", 404)


async def test_a_request_leaves_nothing_in_reference_cycles() -> None:
    """The parser holds the response's callbacks and the response its parser only until the
    message is complete: an agent's every request would otherwise leave a dozen objects for
    Python's cycle collector, which then runs every few dozen requests."""
    async def chunked(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
        return True

    for answer in (keep_alive, chunked):
        async with raw_server(answer) as (_, url), AsyncAgentStateClient(url) as client:
            await client.get_thread("t1")  # the connection, opened once
            with cyclic_garbage() as found:
                for _ in range(5):
                    assert (await client.get_thread("t1")).revision == 3
        assert [name for name in found if name.startswith(("agentstate_client", "httptools"))] \
            == [], answer


class Recorder:
    """Records each request whole, head and body (by its Content-Length), and answers 200."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                writer.write(fixed())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


SENDS = [  # method, path, params, headers, content
    ("GET", "/v1/threads/t1/messages", {"order": "desc", "limit": 20, "fields": "item"}, {}, None),
    ("GET", "/v1/events", {"types": ["thread.created", "message.appended"], "flag": True,
                           "off": False, "none": None, "n": 1.5, "empty": [],
                           "odd": "é/&=?+ #%"}, {}, None),
    ("GET", "/v1/threads", {"empty": []}, {}, None),
    ("GET", "/v1/store/items/a%2Fb/k:@ ä", {}, {}, None),
    ("POST", "/v1/threads", {}, {"Content-Type": "application/json", "Idempotency-Key": "k1"},
     b'{"thread_id":"t1"}'),
    ("POST", "/v1/threads/t1/compact", {}, {}, None),
    ("PUT", "/v1/threads/t1", {}, {"If-Match": '"3"'}, None),
    ("PATCH", "/v1/threads/t1", {}, {}, b""),
    ("DELETE", "/v1/threads/t1", {"hard": True}, {}, None),
]


@pytest.mark.parametrize(("method", "path", "params", "headers", "content"), SENDS)
async def test_a_send_puts_the_same_bytes_on_the_wire_as_an_httpx_request(
        method: str, path: str, params: dict[str, object], headers: dict[str, str],
        content: bytes | None) -> None:
    """The client's own requests skip building an `httpx.Request` (`send`); what reaches
    the server is byte for byte what the transport sends for the `httpx.Request` of the same
    arguments: the path and query encoded as httpx encodes them, the same headers in the
    same order, the same body."""
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{path}"
    headers = {"Accept": "application/json", "Authorization": "Bearer agst_x", **headers}
    timeout = httpx.Timeout(5.0)
    async with server:
        transport = AsyncHTTP1Transport()
        answer = await transport.send(method, url, params, headers, content, timeout)
        assert answer.json() == THREAD
        stock = await transport.handle_async_request(httpx.Request(
            method, url, params=params, headers=headers, content=content,
            extensions={"timeout": timeout.as_dict()}))
        assert json.loads(await stock.aread()) == THREAD
        await transport.aclose()
    sent, expected = recorder.requests
    assert sent == expected


async def test_an_error_answer_names_its_request() -> None:
    async def missing(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        body = b'{"code":"not_found","detail":"no such thread"}'
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/problem+json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async with raw_server(missing) as (_, url), AsyncAgentStateClient(url) as client:
        with pytest.raises(NotFound) as raised:
            await client.get_thread("t1")
    assert raised.value.detail == "no such thread"
    assert raised.value.response.request.url == f"{url}/v1/threads/t1"


@pytest.mark.parametrize("through", ["send", "an httpx.AsyncClient"])
async def test_a_header_that_would_end_its_line_is_refused_unsent(through: str) -> None:
    async with raw_server(keep_alive) as (server, url), httpx.AsyncClient(
            transport=AsyncHTTP1Transport()) as mine, AsyncAgentStateClient(
            url, headers={"X-Tenant-Note": "a\r\nX-Injected: 1"},
            http_client=mine if through != "send" else None) as client:
        with pytest.raises(APIConnectionError, match="Illegal header value") as raised:
            await client.get_thread("t1")
    assert server.requests == []
    assert "X-Injected" not in str(raised.value)  # the value is not repeated
