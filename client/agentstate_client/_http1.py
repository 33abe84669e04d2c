"""A lean HTTP/1.1 keep-alive transport for the async client on a plain `http://` server.

httpx's own transport (httpcore over anyio, parsing with h11) costs about 1 ms of CPU a
request on a small machine, more than the server spends routing one; an agent's turn is a
request or two, so that was most of the client's share of a turn (docs/PERFORMANCE.md).
This transport writes each request in one send on an asyncio stream and parses the answer
with `httptools` (llhttp, the C parser uvicorn serves with), and keeps idle connections for
the next request. The client's own requests come through `send`, which takes the request's
parts instead of an `httpx.Request` (see there). It is used only where nothing else is
needed: `http://` base URLs, no proxy in the environment, `httptools` installed (the
`speedups` extra, part of the async framework adapters' extras); otherwise the client uses
httpx's own transport, as it does for TLS and proxies. Timeouts and errors are httpx's
(`ConnectTimeout`, `ReadTimeout`, `ConnectError`, `ReadError`, `RemoteProtocolError`, ...),
so the client's retry rules apply unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx

try:
    import httptools
except ImportError:  # pragma: no cover - the speedups extra is missing
    httptools = None  # type: ignore[assignment]

READ_SIZE = 65536
# httpx's default limits: connections open at once, and idle ones kept for reuse.
MAX_CONNECTIONS = 100
MAX_IDLE = 20
T = TypeVar("T")
# The request an error names (`httpx.TransportError.request`, `APIError.response.request`):
# made only when there is an error to name it in (`send` builds none otherwise).
RequestOf = Callable[[], httpx.Request]
BODY_METHODS = ("POST", "PUT", "PATCH")  # `Content-Length: 0` with no body, as in httpx

_timeout = getattr(asyncio, "timeout", None)  # Python 3.11 and later


async def _within(seconds: float | None, step: Awaitable[T]) -> T:
    """`step`, or `TimeoutError` after `seconds` (None: no limit)."""
    if _timeout is None:  # pragma: no cover - Python 3.10
        try:
            return await asyncio.wait_for(step, seconds)
        except asyncio.TimeoutError as exc:  # noqa: UP041 - not the builtin before 3.11
            raise TimeoutError from exc
    async with _timeout(seconds):
        return await step


def eligible(base_url: str) -> bool:
    """Whether this transport can serve `base_url` as httpx's would: plain HTTP, `httptools`
    installed, and no proxy from the environment for it (httpx would use that proxy)."""
    url = httpx.URL(base_url)
    if httptools is None or url.scheme != "http":
        return False
    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass(url.host))


class _Message:
    """httptools' callbacks for one response: status, headers, body chunks as they come.
    The parser holds these callbacks and the message its parser until the message is
    complete: then it lets go, so no cycle is left for Python's cycle collector."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.head_done = False
        self.done = False
        self.keep_alive = False
        self.status = 0
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> None:
        if self.parser is not None:
            self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        assert self.parser is not None  # it is calling
        self.status = self.parser.get_status_code()
        # Asked now: once the message is complete, llhttp answers for the next one.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True
        self.parser = None


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        """Still open: the server has not closed it while it was idle (the event loop has
        read its EOF by then)."""
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """The response body, read from the connection as the caller iterates; the connection
    goes back to the pool once the whole message is read, unless either side said close."""

    def __init__(self, transport: AsyncHTTP1Transport, key: tuple[str, int],
                 connection: _Connection, message: _Message, read_timeout: float | None,
                 request: RequestOf) -> None:
        self.transport, self.key, self.connection = transport, key, connection
        self.message, self.read_timeout, self.request = message, read_timeout, request
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        message = self.message
        while True:
            if message.chunks:
                chunks, message.chunks = message.chunks, []
                for chunk in chunks:
                    yield chunk
            if message.done:
                break
            await _feed(self.connection, message, self.read_timeout, self.request)
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.transport.release(self.key, self.connection,
                               reuse=self.message.done and self.message.keep_alive)


def _reason(exc: OSError) -> str:
    return str(exc) or type(exc).__name__


async def _feed(connection: _Connection, message: _Message, timeout: float | None,
                request: RequestOf) -> None:
    """Read once from the connection into the parser; httpx's errors for what goes wrong.
    The connection's fate is the transport's `release` (a message left unfinished closes
    it)."""
    try:
        data = await _within(timeout, connection.reader.read(READ_SIZE))
    except TimeoutError as exc:
        raise httpx.ReadTimeout("timed out reading the response", request=request()) from exc
    except OSError as exc:
        raise httpx.ReadError(_reason(exc), request=request()) from exc
    if not data:
        if message.head_done and not _framed(message):
            message.done = True  # a body delimited by the end of the connection
            message.keep_alive = False
            return
        raise httpx.RemoteProtocolError(
            "Server disconnected without sending a complete response.", request=request())
    try:
        message.feed(data)
    except httptools.HttpParserError as exc:
        raise httpx.RemoteProtocolError(f"malformed response: {exc}",
                                        request=request()) from exc


def _framed(message: _Message) -> bool:
    names = {name.lower() for name, _ in message.headers}
    return b"content-length" in names or b"transfer-encoding" in names


class AsyncHTTP1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive over asyncio streams (see the module docstring)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._fallback: httpx.AsyncHTTPTransport | None = None

    def release(self, key: tuple[str, int], connection: _Connection, reuse: bool) -> None:
        """A request is done with `connection`: kept for the next, or closed."""
        self._slots.release()
        idle = self._idle.setdefault(key, [])
        if reuse and len(idle) < MAX_IDLE:
            idle.append(connection)
        else:
            connection.close()

    async def _connection(self, key: tuple[str, int], timeouts: dict[str, float | None],
                          request: RequestOf) -> _Connection:
        try:
            await _within(timeouts.get("pool"), self._slots.acquire())
        except TimeoutError as exc:
            raise httpx.PoolTimeout("timed out waiting for a connection",
                                    request=request()) from exc
        try:
            return await self._open(key, timeouts.get("connect"), request)
        except BaseException:
            self._slots.release()
            raise

    async def _open(self, key: tuple[str, int], timeout: float | None,
                    request: RequestOf) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.close()
        try:
            reader, writer = await _within(timeout, asyncio.open_connection(*key))
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("timed out connecting", request=request()) from exc
        except OSError as exc:
            raise httpx.ConnectError(_reason(exc), request=request()) from exc
        return _Connection(reader, writer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":  # an answer with a length and no body: httpx's own
            self._fallback = self._fallback or httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        head = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
        head.extend(_line(*pair) for pair in request.headers.raw)
        key = (request.url.host, request.url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        connection, message = await self._exchange(
            key, head, await request.aread(), timeouts, lambda: request)
        return httpx.Response(
            message.status, headers=message.headers,
            stream=_Body(self, key, connection, message, timeouts.get("read"), lambda: request),
            extensions={"http_version": b"HTTP/1.1"}, request=request)

    async def send(self, method: str, url: str, params: Mapping[str, Any],
                   headers: Mapping[str, str], content: bytes | None,
                   timeout: httpx.Timeout) -> httpx.Response:
        """What `handle_async_request(httpx.Request(method, url, params=..., headers=...,
        content=...))` answers, read whole, with the same bytes on the wire, but without
        building the `httpx.Request`: its URL parse and query merge cost a request's worth
        of the client's CPU (the client's own requests use this; tests/client/test_http1.py
        holds the bytes equal). An error response carries the request, made then."""
        def request() -> httpx.Request:
            return httpx.Request(method, url, params=params, headers=headers, content=content,
                                 extensions={"timeout": timeout.as_dict()})

        if method == "HEAD" or "?" in url:
            response = await self.handle_async_request(request())
            await response.aread()
            return response

        key, host, path = _origin(url)
        target = path + b"?" + _query(params).encode() if params else path
        head = [b"%s %s HTTP/1.1" % (method.encode(), target), b"Host: " + host]
        if not content and method in BODY_METHODS:
            head.append(b"Content-Length: 0")
        head.extend(_line(name.encode("ascii"), value.encode("ascii"))
                    for name, value in headers.items())
        if content:
            head.append(b"Content-Length: %d" % len(content))
        timeouts = timeout.as_dict()
        connection, message = await self._exchange(key, head, content or b"", timeouts, request)
        body = _Body(self, key, connection, message, timeouts.get("read"), request)
        try:
            content = b"".join([chunk async for chunk in body])
        finally:
            await body.aclose()
        response = httpx.Response(message.status, headers=message.headers, content=content,
                                  extensions={"http_version": b"HTTP/1.1"})
        if message.status >= 400:
            response.request = request()
        return response

    async def _exchange(self, key: tuple[str, int], head: list[bytes], body: bytes,
                        timeouts: dict[str, float | None],
                        request: RequestOf) -> tuple[_Connection, _Message]:
        """Send the request (its head lines and body) on a connection for `key` and read up
        to the end of the answer's head: the connection and the message being read."""
        connection = await self._connection(key, timeouts, request)
        message = _Message()
        try:
            connection.writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            if connection.writer.transport.get_write_buffer_size():
                await _within(timeouts.get("write"), connection.writer.drain())
            read_timeout = timeouts.get("read")
            while not message.head_done:
                await _feed(connection, message, read_timeout, request)
        except BaseException as exc:
            # Cancelled, or failed: the connection's state is unknown, it is not reused.
            self.release(key, connection, reuse=False)
            if isinstance(exc, TimeoutError):
                raise httpx.WriteTimeout("timed out sending the request",
                                         request=request()) from exc
            if isinstance(exc, OSError):
                raise httpx.WriteError(_reason(exc), request=request()) from exc
            raise
        return connection, message

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        if self._fallback is not None:
            await self._fallback.aclose()


@functools.lru_cache(maxsize=1024)
def _origin(url: str) -> tuple[tuple[str, int], bytes, bytes]:
    """The (host, port) a URL with no query is sent to, its Host header and its path, as
    httpx encodes them; kept for the URLs used lately, since httpx's parse of one costs
    more than the rest of the request's head."""
    parsed = httpx.URL(url)
    return (parsed.host, parsed.port or 80), parsed.netloc, parsed.raw_path


def _query(params: Mapping[str, Any]) -> str:
    """The query httpx makes of `params` (`httpx.QueryParams`): a list or tuple is the
    parameter repeated, True and False are `true` and `false`, None is empty."""
    items: list[tuple[str, str]] = []
    for name, value in params.items():
        for one in value if isinstance(value, list | tuple) else (value,):
            items.append((name, "true" if one is True else "false" if one is False
                          else "" if one is None else str(one)))
    return urlencode(items)


def _line(name: bytes, value: bytes) -> bytes:
    """A header line; a name or value that would end the line early is refused, as httpx's
    own transport refuses it (naming the header, not the value: it may be a secret)."""
    if b"\r" in name or b"\n" in name or b"\r" in value or b"\n" in value:
        raise httpx.LocalProtocolError(f"Illegal header value in {name.decode(errors='replace')!r}")
    return b"%s: %s" % (name, value)
