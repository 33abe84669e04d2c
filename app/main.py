"""The application factory. `create_app(settings)` is the only way an app is built."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI

from app import __version__
from app.agent_states.router import router as agent_states_router
from app.auth.authenticator import Authenticator
from app.batch.router import router as batch_router
from app.checkpoints.router import router as checkpoints_router
from app.compactions.router import router as compactions_router
from app.console.router import router as console_router
from app.core.logging import configure_logging
from app.core.metrics import Metrics
from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.db.tenancy import install_tenant_guard
from app.events.feed import Feed
from app.events.router import router as events_router
from app.http.middleware import install_middleware
from app.http.openapi import install_openapi, operation_id
from app.http.posture import install_posture
from app.http.problems import install_handlers
from app.http.routing import DomainRoute, build_route_contexts
from app.http.tracing import install_tracing
from app.mcp_servers.router import router as mcp_servers_router
from app.messages.router import lineage_router
from app.messages.router import router as messages_router
from app.ops.router import router as ops_router
from app.ops.service import ReadinessCheck
from app.ops.startup import start
from app.retention.service import Retention, Sweeper
from app.store.langgraph_router import router as langgraph_store_router
from app.store.router import router as store_router
from app.threads.router import router as threads_router

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

ROUTERS = [
    ops_router, threads_router, messages_router, lineage_router, compactions_router, agent_states_router,
    mcp_servers_router, events_router, batch_router, checkpoints_router, store_router,
    langgraph_store_router,
]


def create_app(settings: Settings | None = None, *,
               tracer_provider: TracerProvider | None = None) -> FastAPI:
    """The application; `tracer_provider` traces it there, whatever the settings say."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings)
        feed: Feed | None = None
        sweeper: Sweeper | None = None
        install_tenant_guard(db.engine)
        metrics.watch_pool(db.engine)
        tracing.watch(db.engine)
        try:
            app.state.db = db
            app.state.readiness = ReadinessCheck(db, app.state.schema_head,
                                                 settings.retry_after_seconds)
            await start(app, settings, db)
            app.state.feed = feed = Feed(db, settings)
            await feed.start()
            if getattr(app.state, "strict_start", False):  # served by `agentstate serve`
                _on_stop_signal(app, feed.close_watchers, settings.drain_seconds)
                # What the first requests would wait for (40-70 ms here): the routes'
                # contexts FastAPI builds at a router's first request, and anyio's asyncio
                # backend, imported at its first use.
                build_route_contexts(app)
                anyio.get_cancelled_exc_class()
            if settings.sweep_enabled:
                sweeper = Sweeper(Retention(db, settings, feed), settings.sweep_interval_seconds)
                sweeper.start()
            yield
        finally:
            if sweeper is not None:
                await sweeper.stop()
            if feed is not None:
                await feed.stop()
            await db.dispose()
            metrics.close()
            tracing.close()

    app = FastAPI(
        title="agentstate",
        version=__version__,  # the installed package's, as `agentstate --version` says
        summary="The state service AI agents keep their memory in.",
        description=(
            "Threads (run state), conversation messages, compactions, agent states, MCP server "
            "state and an audit trail. Errors are RFC 9457 problem details "
            "(`application/problem+json`) with a stable `code`. Mutable resources carry a "
            "`revision`, sent as a strong `ETag`; writes take `If-Match`."
        ),
        lifespan=lifespan,
        # A trailing slash is a 404 problem, never a redirect built from the Host header.
        redirect_slashes=False,
        # Readable operationIds (`getThread`); Swagger UI comes from local assets, no ReDoc.
        generate_unique_id_function=operation_id,
        docs_url=None,
        redoc_url=None,
        # Traces are app/http/tracing.py's, metrics /metrics', logs app/core/logging.py's.
        # FastAPI's own would start by themselves once anything in the process sets a global
        # OpenTelemetry provider, and ask whether one is set on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    # Routes added to the application itself (not through a DomainRouter) may hold a unit of
    # work too (app/http/dependencies.py).
    app.router.route_class = DomainRoute
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.draining = False  # SIGTERM with AGENTSTATE_DRAIN_SECONDS (see _on_stop_signal)
    app.state.authenticator = Authenticator(settings.auth_cache_seconds, settings.require_api_keys)
    app.state.schema_head = migrate.head_revision()
    install_handlers(app)
    install_middleware(app, metrics, settings.max_body_bytes, settings.max_json_depth,
                       settings.max_checkpoint_body_bytes)
    tracing = install_tracing(app, settings, tracer_provider)
    for router in ROUTERS:
        app.include_router(router)
    if settings.console_enabled:  # the audit console, docs/console.md
        app.include_router(console_router)
    install_openapi(app)
    return app


def _on_stop_signal(app: FastAPI, callback: Callable[[], None], drain_seconds: float) -> None:
    """Also run `callback` in the event loop when SIGTERM or SIGINT arrives, after the handler
    uvicorn installed (which begins the graceful shutdown, then waits for open responses):
    so the feed ends its streams at once instead of holding the shutdown. uvicorn puts the
    handlers it replaced back when it stops.

    With `drain_seconds`, the first SIGTERM only marks the server draining (/readyz answers
    503, everything else is served as before) and the shutdown begins that much later: a
    load balancer checking /readyz takes the server out of rotation before it stops
    accepting connections. Another SIGTERM, or SIGINT, stops it at once."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = signal.getsignal(sig)

        def stop(number: int, frame: FrameType | None, before: Any = before) -> None:
            if callable(before):
                before(number, frame)
            loop.call_soon_threadsafe(callback)

        def handler(number: int, frame: FrameType | None, stop: Any = stop) -> None:
            if number == signal.SIGTERM and drain_seconds and not app.state.draining:
                app.state.draining = True
                loop.call_soon_threadsafe(loop.call_later, drain_seconds, stop, number, frame)
                return
            stop(number, frame)

        signal.signal(sig, handler)


def serve_app() -> FastAPI:
    """The factory `agentstate serve` gives uvicorn (each worker calls it)."""
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    # Served for real: a failed start-up check stops the server instead of serving 503s.
    app.state.strict_start = True
    install_posture(app, settings)
    return app
