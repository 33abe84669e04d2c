"""Operations endpoints: liveness, readiness, metrics. Not under /v1, never authenticated."""

from __future__ import annotations

from fastapi import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from app.core.errors import NotReady
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(tags=["operations"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    schema_revision: str | None


@router.get("/healthz", operation_id="getHealth", summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", operation_id="getReadiness", responses=responses(503), summary="Database reachable and migrated")
async def readyz(request: Request) -> Readiness:
    state = request.app.state
    if state.draining:  # out of the balancer's rotation before the shutdown begins
        raise NotReady("The server is shutting down.", cause="draining",
                       headers={"Retry-After": str(state.settings.retry_after_seconds)})
    revision = await state.readiness.check()
    return Readiness(status="ready", database=state.db.dialect, schema_revision=revision)


@router.get("/metrics", operation_id="getMetrics", response_class=Response, summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
