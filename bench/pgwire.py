"""A TCP proxy in front of Postgres that counts what its clients send: statements (simple
`Query` messages and extended-protocol `Execute`s) and round trips (a `Query` or a `Sync`
waits for the server's answer), so two systems that talk to Postgres through different
drivers (asyncpg, psycopg) are counted the same way.

    with WireCounter("127.0.0.1", 5432) as proxy:   # proxy.port: point a client at it
        ...
        proxy.counts()  # {"statements": n, "round_trips": m}

Needs a connection without TLS (the local server has `ssl = off`). Runs in a thread of its
own, so it adds a hop to every message: count with it, time without it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any

_SSL_REQUEST = 80877103
_CANCEL = 80877102


class WireCounter:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.upstream = host, port
        self.statements = 0
        self.round_trips = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    def __enter__(self) -> WireCounter:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        started.result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def counts(self) -> dict[str, int]:
        return {"statements": self.statements, "round_trips": self.round_trips}

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream)
        except OSError:
            writer.close()
            return
        back = asyncio.ensure_future(self._pipe(up_reader, writer))
        try:
            await self._client(reader, up_writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            up_writer.close()
            await asyncio.gather(back, return_exceptions=True)
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        # Untyped start-up messages first (an SSL request, answered "N", then the startup).
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            rest = await reader.readexactly(length - 8)
            up.write(head + rest)
            await up.drain()
            if code == _CANCEL:
                return
            if code != _SSL_REQUEST:
                break
        while True:
            kind = await reader.readexactly(1)
            size = await reader.readexactly(4)
            body = await reader.readexactly(struct.unpack("!i", size)[0] - 4)
            if kind == b"Q":
                self.statements += 1
                self.round_trips += 1
            elif kind == b"E":
                self.statements += 1
            elif kind == b"S":
                self.round_trips += 1
            up.write(kind + size + body)
            await up.drain()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: Any) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
