"""The blocking client."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import httpx

from agentstate_client._api import _Api
from agentstate_client._core import _SyncDriver, tls_context

# One name in both modules, so both clients' `watch` read the same in help().
from agentstate_client._watch import Watch as FeedWatch


class AgentStateClient(_SyncDriver, _Api):
    """A blocking client for the agentstate API.

    `base_url` defaults to `$AGENTSTATE_URL` (else `http://127.0.0.1:8080`), `api_key` to
    `$AGENTSTATE_API_KEY`. Safe requests, appends and compactions are retried
    `max_retries` times on connection errors, 408/429/5xx and in-flight idempotent requests,
    with exponential backoff from `backoff` seconds (and jitter), honouring `Retry-After`.
    Pass `http_client` to reuse your own `httpx.Client` (it is not closed by `close()`), or
    `transport` to plug in an `httpx` transport. Use it as a context manager, or call `close()`.
    """

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 30.0, max_retries: int = 2,
                 backoff: float = 0.5, headers: dict[str, str] | None = None,
                 http_client: httpx.Client | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._configure(base_url, api_key, timeout, max_retries, backoff, headers,
                        own_http=http_client is None, own_transport=transport is not None)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(
            transport=transport, verify=tls_context() if transport is None else True)

    def watch(self, *, cursor: str | None = None, thread_id: str | None = None,
              types: Sequence[str] | None = None, resource_prefix: str | None = None,
              idle_timeout: float = 60.0) -> FeedWatch:
        """Watch the change feed: every event after `cursor` (None: from the start), then
        each new one as it commits, for as long as you iterate (`for`).
        Filters as `list_events`. Reconnects after a dropped connection or a server restart
        and resumes after the last event it yielded, so none is lost or repeated;
        `.cursor` is that event's cursor (keep it to resume later). Stop with
        `close()` or by leaving the loop; API errors other than 408/429/5xx raise."""
        return FeedWatch(self._http, self._core, cursor=cursor, thread_id=thread_id, types=types,
                     resource_prefix=resource_prefix, idle_timeout=idle_timeout)

    def close(self) -> None:
        """Close the connection pool (unless the `httpx.Client` was passed in)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> AgentStateClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
