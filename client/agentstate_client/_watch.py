"""Watching the change feed: `client.watch()`, over `GET /v1/events/stream` (SSE).

A watch yields every event after its cursor and then each new one as it becomes visible, for
as long as you iterate. When the connection drops (a network error, a server restart, a load
balancer closing an idle stream) it reconnects with backoff and resumes after the last event
it yielded (`Last-Event-ID`), so no event is lost or repeated. `watch.cursor` is the cursor
of the last event yielded: keep it to resume in another process with `watch(cursor=...)`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import httpx

from agentstate_client import _tracing
from agentstate_client._core import RETRY_EXCEPTIONS, RETRY_STATUSES, Core, drop_none
from agentstate_client.errors import error_from_response
from agentstate_client.models import Event

# The server sends a comment every 15 s on an idle stream (AGENTSTATE_EVENTS_HEARTBEAT_SECONDS);
# nothing for this long means the connection is dead.
IDLE_TIMEOUT = 60.0


class _Stream:
    """What both watches share: the request, and parsing `text/event-stream` lines."""

    def __init__(self, core: Core, cursor: str | None, thread_id: str | None,
                 types: Sequence[str] | None, resource_prefix: str | None,
                 idle_timeout: float) -> None:
        self.core = core
        self.cursor = cursor
        self.params = drop_none(thread_id=thread_id, type=list(types) if types else None,
                                resource_prefix=resource_prefix)
        self.timeout = httpx.Timeout(core.timeout.connect or 30.0, read=idle_timeout,
                                     write=core.timeout.write, pool=core.timeout.pool)
        self.attempt = 0
        self._id: str | None = None
        self._data: list[str] = []

    def request(self) -> dict[str, Any]:
        headers = {**self.core.headers, "Accept": "text/event-stream"}
        if self.cursor is not None:
            headers["Last-Event-ID"] = self.cursor
        _tracing.inject(headers)  # the caller's trace, when OpenTelemetry is in use
        return {"method": "GET", "url": f"{self.core.base_url}/v1/events/stream",
                "params": self.params, "headers": headers, "timeout": self.timeout}

    def feed(self, line: str) -> Event | None:
        """One line of the stream; the event it completes, if any."""
        if line == "":
            data, self._data = self._data, []
            if not data or self._id is None:
                return None
            self.cursor = self._id
            return Event.from_json(json.loads("\n".join(data)))
        if line.startswith(":"):
            return None  # a heartbeat
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "data":
            self._data.append(value)
        return None

    def reset(self) -> None:
        self._id, self._data = None, []

    def refused(self, response: httpx.Response) -> float:
        """A non-2xx answer: the delay before trying again, or the error raised."""
        if response.status_code not in RETRY_STATUSES:
            raise error_from_response(response)
        return self.backoff(response)

    def backoff(self, response: httpx.Response | None = None) -> float:
        delay = self.core.retry.delay(min(self.attempt, 4), response)
        self.attempt += 1
        return delay


class Watch(_Stream):
    """A blocking watch: iterate it; `close()` (or leave the `with` block) to stop."""

    def __init__(self, http: httpx.Client, core: Core, **options: Any) -> None:
        super().__init__(core, **options)
        self.http = http
        self._response: httpx.Response | None = None
        self._closed = False

    def __iter__(self) -> Iterator[Event]:
        while not self._closed:
            try:
                with self.http.stream(**self.request()) as response:
                    self._response = response
                    if not response.is_success:
                        response.read()
                        delay = self.refused(response)
                    else:
                        self.attempt = 0
                        yield from self._events(response.iter_lines())
                        delay = self.backoff()  # the server ended the stream
            except RETRY_EXCEPTIONS:
                delay = self.backoff()
            finally:
                self._response = None
                self.reset()
            if not self._closed:
                time.sleep(delay)

    def _events(self, lines: Iterable[str]) -> Iterator[Event]:
        for line in lines:
            event = self.feed(line)
            if event is not None:
                yield event

    def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatch(_Stream):
    """An asyncio watch: `async for` over it; `aclose()` (or `async with`) to stop."""

    def __init__(self, http: httpx.AsyncClient, core: Core, **options: Any) -> None:
        super().__init__(core, **options)
        self.http = http
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while not self._closed:
            try:
                async with self.http.stream(**self.request()) as response:
                    if not response.is_success:
                        await response.aread()
                        delay = self.refused(response)
                    else:
                        self.attempt = 0
                        async for line in response.aiter_lines():
                            event = self.feed(line)
                            if event is not None:
                                yield event
                        delay = self.backoff()
            except RETRY_EXCEPTIONS:
                delay = self.backoff()
            finally:
                self.reset()
            if not self._closed:
                await asyncio.sleep(delay)

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
