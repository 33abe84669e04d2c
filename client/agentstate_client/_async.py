"""The asyncio client."""

from __future__ import annotations

from types import TracebackType

import httpx

from agentstate_client._api import _Api
from agentstate_client._core import _AsyncDriver


class AsyncAgentStateClient(_AsyncDriver, _Api):
    """An asyncio client for the agentstate API.

    `base_url` defaults to `$AGENTSTATE_URL` (else `http://127.0.0.1:8080`), `api_key` to
    `$AGENTSTATE_API_KEY`. Safe requests, appends and compactions are retried
    `max_retries` times on connection errors, 408/429/5xx and in-flight idempotent requests,
    with exponential backoff from `backoff` seconds (and jitter), honouring `Retry-After`.
    Pass `http_client` to reuse your own `httpx.AsyncClient` (it is not closed by
    `aclose()`), or `transport` to plug in an `httpx` async transport. Use it as an async
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
        self._http = http_client or httpx.AsyncClient(transport=transport)

    async def aclose(self) -> None:
        """Close the connection pool (unless the `httpx.AsyncClient` was passed in)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAgentStateClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
