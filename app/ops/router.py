"""Operations endpoints: liveness, readiness, metrics. Not under /v1, never authenticated."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy import text

from app.core.errors import NotReady
from app.core.problems import responses
from app.db import migrate

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    schema_revision: str | None


@router.get("/healthz", summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses=responses(503), summary="Database reachable and migrated")
async def readyz(request: Request) -> Readiness:
    db = request.app.state.db
    retry = {"Retry-After": str(request.app.state.settings.retry_after_seconds)}
    try:
        async with db.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
        current = await migrate.current_revision(db.engine)
    except Exception:  # noqa: BLE001 - any failure to reach the database means not ready
        raise NotReady("The database is unreachable.", headers=retry) from None
    head = request.app.state.schema_head
    if current != head:
        raise NotReady(
            f"The database schema is at {current or 'nothing'}, not {head}; run `agentstate migrate`.",
            headers=retry,
        )
    return Readiness(status="ready", database=db.dialect, schema_revision=current)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
