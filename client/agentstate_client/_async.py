"""The asyncio client."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import httpx

from agentstate_client._api import _Api
from agentstate_client._core import _AsyncDriver, tls_context
from agentstate_client._http1 import AsyncHTTP1Transport, eligible

# One name in both modules, so both clients' `watch` read the same in help().
from agentstate_client._watch import AsyncWatch as FeedWatch


class AsyncAgentStateClient(_AsyncDriver, _Api):
    """An asyncio client for the agentstate API.

    `base_url` defaults to `$AGENTSTATE_URL` (else `http://127.0.0.1:8080`), `api_key` to
    `$AGENTSTATE_API_KEY`. Safe requests, appends and compactions are retried
    `max_retries` times on connection errors, 408/429/5xx and in-flight idempotent requests,
    with exponential backoff from `backoff` seconds (and jitter), honouring `Retry-After`.
    Pass `http_client` to reuse your own `httpx.AsyncClient` (it is not closed by
    `aclose()`), or `transport` to plug in an `httpx` async transport; without either, a
    plain `http://` server is reached through a lean keep-alive transport when `httptools`
    is installed (the `speedups` extra), else through httpx's own. Use it as an async
    context manager, or call `aclose()`.
    """

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 30.0, max_retries: int = 2,
                 backoff: float = 0.5, headers: dict[str, str] | None = None,
                 http_client: httpx.AsyncClient | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._configure(base_url, api_key, timeout, max_retries, backoff, headers,
                        own_http=http_client is None, own_transport=transport is not None)
        self._owns_http = http_client is None
        if http_client is None and transport is None and eligible(self._core.base_url):
            transport = self._direct = AsyncHTTP1Transport()
        self._http = http_client or httpx.AsyncClient(
            transport=transport, verify=tls_context() if transport is None else True)

    def watch(self, *, cursor: str | None = None, thread_id: str | None = None,
              types: Sequence[str] | None = None, resource_prefix: str | None = None,
              idle_timeout: float = 60.0) -> FeedWatch:
        """Watch the change feed: every event after `cursor` (None: from the start), then
        each new one as it commits, for as long as you iterate (`async for`).
        Filters as `list_events`. Reconnects after a dropped connection or a server restart
        and resumes after the last event it yielded, so none is lost or repeated;
        `.cursor` is that event's cursor (keep it to resume later). Stop with
        `aclose()` or by leaving the loop; API errors other than 408/429/5xx raise."""
        return FeedWatch(self._http, self._core, cursor=cursor, thread_id=thread_id, types=types,
                     resource_prefix=resource_prefix, idle_timeout=idle_timeout)

    async def aclose(self) -> None:
        """Close the connection pool (unless the `httpx.AsyncClient` was passed in)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAgentStateClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
