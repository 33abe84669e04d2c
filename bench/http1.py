"""A minimal HTTP/1.1 keep-alive client for the load generator.

httpx spends more CPU per request than a one-worker uvicorn does, so on a 2-core machine it
would measure itself. This client writes the request bytes and reads `Content-Length` bodies
(what uvicorn sends for every JSON response), nothing more.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

Headers = dict[bytes, bytes]


class HttpError(RuntimeError):
    pass


class Connection:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except ConnectionError:
                pass

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, Headers, bytes]:
        if self.writer is None:
            await self.connect()
        assert self.reader is not None and self.writer is not None
        lines = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._host_header]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}".encode())
        if body is not None:
            lines.append(b"content-type: application/json")
            lines.append(b"content-length: " + str(len(body)).encode())
        self.writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        response_headers: Headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            response_headers[name.strip().lower()] = value.strip()
        if b"transfer-encoding" in response_headers:
            raise HttpError("chunked responses are not supported by the bench client")
        length = int(response_headers.get(b"content-length", b"0"))
        payload = await self.reader.readexactly(length) if length else b""
        return status, response_headers, payload
