"""Liveness, readiness (the database answers, migrations are current) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from recstore.admin import db
from recstore.admin.api.deps import ContextDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable or not migrated"}})
def readyz(context: ContextDep) -> JSONResponse:
    try:
        with context.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        revision = db.current_revision(context.engine)
    except Exception as exc:  # any driver error means "not ready", with the reason
        return JSONResponse({"status": "unavailable", "reason": type(exc).__name__}, 503)
    if revision != db.head_revision():
        return JSONResponse({"status": "unavailable", "reason": f"schema at {revision}"}, 503)
    return JSONResponse({"status": "ok", "schema": revision})


@router.get("/metrics", response_class=Response)
def metrics(context: ContextDep) -> Response:
    return Response(generate_latest(context.registry), media_type=CONTENT_TYPE_LATEST)
