"""The machinery both clients share: request building, retries, error parsing, and the
`operation` descriptor that lets every API method be written once.

Each API method is a generator ("sans-I/O"): it yields `Send` and `Sleep` steps and receives
responses, so the same code runs under the blocking client (`_SyncDriver`) and the asyncio
client (`_AsyncDriver`); only the drivers do I/O.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import inspect
import json
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload
from urllib.parse import quote

import httpx

from agentstate_client import _tracing
from agentstate_client.errors import (
    APIConnectionError,
    APITimeoutError,
    IdempotencyInFlight,
    error_from_response,
)
from agentstate_client.models import Page

if TYPE_CHECKING:
    from agentstate_client._http1 import AsyncHTTP1Transport

__version__ = "0.1.0"
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Transport failures worth another attempt; others (bad URL scheme, proxy misconfiguration)
# would fail the same way again.
RETRY_EXCEPTIONS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
_OMIT: Any = object()


def segment(value: str) -> str:
    """One path segment; `:` and `@` are legal in names and stay readable."""
    return quote(value, safe=":@")


def if_match_header(value: int | str) -> str:
    """An int revision becomes its strong ETag; strings (`*`, a raw ETag) pass through."""
    return f'"{value}"' if isinstance(value, int) else value


def drop_none(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (its CA roots, or `SSL_CERT_FILE` / `SSL_CERT_DIR` where
    set), made once per process and setting for every client: httpx makes one per client,
    even for an `http://` server, and reading the CA bundle takes 50 ms."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context(verify=True, trust_env=True)  # reads the two itself


@dataclass(frozen=True)
class Request:
    """What an operation wants sent; the core turns it into an `httpx.Request` per attempt."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = _OMIT
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    @property
    def retryable(self) -> bool:
        # Safe methods, and writes whose Idempotency-Key makes a repeat return the original.
        return self.method in SAFE_METHODS or "Idempotency-Key" in self.headers


@dataclass(frozen=True)
class Send:
    """Step: send this request, resume with the `httpx.Response` (or its transport error)."""

    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Sleep:
    """Step: wait, then resume."""

    seconds: float


Op = Generator["Send | Sleep", Any, R]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; `Retry-After` wins when the server sends one."""

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        retry_after = _retry_after(response) if response is not None else None
        if retry_after is not None and 0 <= retry_after <= self.max_retry_after:
            return retry_after
        backoff = min(self.max_delay, self.initial_delay * 2.0**attempt)
        return backoff * (1 - 0.25 * random.random())


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Core:
    """Configuration and the request/response cycle shared by both clients."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout: float | httpx.Timeout,
                 retry: RetryPolicy, headers: dict[str, str] | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.retry = retry
        self.headers = {"Accept": "application/json",
                        "User-Agent": f"agentstate-client/{__version__}", **(headers or {})}
        # `keys create` prints the token with a newline, and a file or secret keeps it; a
        # newline in a header value is refused by httpx ("Illegal header value").
        api_key = api_key.strip() if api_key else api_key
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def __repr__(self) -> str:  # never shows the API key
        return f"<Core {self.base_url}>"

    def prepare(self, request: Request) -> dict[str, Any]:
        headers = {**self.headers, **request.headers}
        kwargs: dict[str, Any] = {
            "method": request.method, "url": self.base_url + request.path,
            "params": request.params, "headers": headers, "timeout": self.timeout,
        }
        if request.json is not _OMIT:
            headers["Content-Type"] = request.content_type
            kwargs["content"] = json.dumps(request.json, separators=(",", ":")).encode()
        return kwargs

    def call(self, request: Request) -> Op[httpx.Response]:
        """Send with retries; a 2xx or 304 response, else the matching `APIError` raised."""
        attempt = 0
        while True:
            try:
                response: httpx.Response = yield Send(self.prepare(request))
            except RETRY_EXCEPTIONS as exc:
                if not (request.retryable and attempt < self.retry.max_retries):
                    raise _connection_error(exc) from exc
                delay = self.retry.delay(attempt)
            except httpx.TransportError as exc:
                raise _connection_error(exc) from exc
            else:
                if response.is_success or response.status_code == 304:
                    return response
                error = error_from_response(response)
                retry = response.status_code in RETRY_STATUSES or isinstance(
                    error, IdempotencyInFlight)
                if not (retry and request.retryable and attempt < self.retry.max_retries):
                    raise error
                delay = self.retry.delay(attempt, response)
            attempt += 1
            yield Sleep(delay)

    def json(self, request: Request) -> Op[Any]:
        response = yield from self.call(request)
        return response.json()


def _connection_error(exc: httpx.TransportError) -> APIConnectionError:
    cls = APITimeoutError if isinstance(exc, httpx.TimeoutException) else APIConnectionError
    try:
        request: httpx.Request | None = exc.request
    except RuntimeError:
        request = None
    return cls(f"{type(exc).__name__}: {exc}", request=request)


@dataclass(frozen=True)
class _Done:
    value: Any


def _resume(steps: Op[Any], reply: Any, error: BaseException | None) -> Send | Sleep | _Done:
    """Feed the last step's outcome (a response, or the transport error to raise inside the
    operation) into `steps`; the next step, or `_Done` with the operation's result."""
    try:
        return steps.throw(error) if error is not None else steps.send(reply)
    except StopIteration as stop:
        return _Done(stop.value)


class _SyncDriver:
    """Runs operations with blocking I/O."""

    _http: httpx.Client

    def _drive(self, steps: Op[R]) -> R:
        outcome: tuple[Any, BaseException | None] = (None, None)
        while not isinstance(step := _resume(steps, *outcome), _Done):
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                outcome = (None, None)
                continue
            with _tracing.attempt(steps, step.kwargs) as span:
                try:
                    outcome = (self._http.send(self._http.build_request(**step.kwargs)), None)
                except httpx.TransportError as exc:
                    outcome = (None, exc)
                span.record(*outcome)
        return step.value  # type: ignore[no-any-return]


class _AsyncDriver:
    """Runs operations on asyncio."""

    _http: httpx.AsyncClient
    # The lean transport requests go to directly, when the client built its
    # `httpx.AsyncClient` itself: nothing of that client's own (cookies, auth, redirects,
    # hooks) is in use then, and its request and response handling cost as much CPU again
    # as the transport.
    _direct: AsyncHTTP1Transport | None = None

    async def _send(self, kwargs: dict[str, Any]) -> httpx.Response:
        if self._direct is None:
            return await self._http.send(self._http.build_request(**kwargs))
        return await self._direct.send(kwargs["method"], kwargs["url"], kwargs["params"],
                                       kwargs["headers"], kwargs.get("content"),
                                       kwargs["timeout"])

    async def _drive(self, steps: Op[R]) -> R:
        outcome: tuple[Any, BaseException | None] = (None, None)
        while not isinstance(step := _resume(steps, *outcome), _Done):
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                outcome = (None, None)
                continue
            with _tracing.attempt(steps, step.kwargs) as span:
                try:
                    outcome = (await self._send(step.kwargs), None)
                except httpx.TransportError as exc:
                    outcome = (None, exc)
                span.record(*outcome)
        return step.value  # type: ignore[no-any-return]


class operation(Generic[P, R]):
    """Turns a generator method into a blocking method on `AgentStateClient` and a
    coroutine method on `AsyncAgentStateClient`, with the same signature and docstring."""

    def __init__(self, steps: Callable[Concatenate[Any, P], Op[R]]) -> None:
        self.steps = steps
        functools.update_wrapper(self, steps)  # type: ignore[arg-type]
        # What help() and editors should show: the method as called, returning the model.
        signature = inspect.signature(steps)
        returns = signature.return_annotation
        if isinstance(returns, str) and returns.startswith("Op["):
            returns = returns[3:-1]
        self.__signature__ = signature.replace(
            parameters=list(signature.parameters.values())[1:], return_annotation=returns)

    def _present(self, method: Callable[..., Any]) -> Callable[..., Any]:
        functools.update_wrapper(method, self.steps)
        method.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return method

    @overload
    def __get__(self, obj: None, owner: type) -> operation[P, R]: ...
    @overload
    def __get__(self, obj: _SyncDriver, owner: type) -> Callable[P, R]: ...
    @overload
    def __get__(self, obj: _AsyncDriver, owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        steps = self.steps
        if isinstance(obj, _AsyncDriver):
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await obj._drive(steps(obj, *args, **kwargs))
            return self._present(run_async)

        def run(*args: Any, **kwargs: Any) -> Any:
            return obj._drive(steps(obj, *args, **kwargs))
        return self._present(run)


class paginated(Generic[P, T]):
    """`iter_x = paginated(list_x)`: every item of every page, fetching pages as it goes."""

    def __init__(self, page: operation[P, Page[T]]) -> None:
        self.page = page.steps
        self.__doc__ = (f"Iterate over every item `{page.steps.__name__}` lists (same "
                        "arguments), fetching the next page as it goes.")
        returns = str(page.__signature__.return_annotation)
        item = returns[5:-1] if returns.startswith("Page[") else "Any"
        self.__signature__ = page.__signature__.replace(return_annotation=f"Iterator[{item}]")

    def _present(self, method: Callable[..., Any]) -> Callable[..., Any]:
        method.__doc__ = self.__doc__
        method.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return method

    @overload
    def __get__(self, obj: None, owner: type) -> paginated[P, T]: ...
    @overload
    def __get__(self, obj: _SyncDriver, owner: type) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: _AsyncDriver, owner: type) -> Callable[P, AsyncIterator[T]]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        page: Callable[..., Op[Page[Any]]] = self.page  # called with a cursor of its own
        if isinstance(obj, _AsyncDriver):
            async def iterate_async(*args: Any, cursor: str | None = None,
                                    **kwargs: Any) -> AsyncIterator[Any]:
                while True:
                    result = await obj._drive(page(obj, *args, cursor=cursor, **kwargs))
                    for item in result.data:
                        yield item
                    if not result.has_more or result.next_cursor is None:
                        return
                    cursor = result.next_cursor
            return self._present(iterate_async)

        def iterate(*args: Any, cursor: str | None = None, **kwargs: Any) -> Iterator[Any]:
            while True:
                result = obj._drive(page(obj, *args, cursor=cursor, **kwargs))
                yield from result.data
                if not result.has_more or result.next_cursor is None:
                    return
                cursor = result.next_cursor
        return self._present(iterate)
