"""The app factory: ``create_app(settings) -> FastAPI``.

Building the app opens the database and applies the alembic migrations, so a
freshly started service always runs on the schema it was written for.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError

from recstore import __version__
from recstore.admin import db
from recstore.admin.api.routes import (
    checkpoints,
    dashboard,
    events,
    health,
    nodes,
    pools,
    tables,
    tokens,
)
from recstore.admin.body_limit import BodyLimit
from recstore.admin.context import AppContext
from recstore.admin.errors import http_status_of
from recstore.admin.observability import install_metrics
from recstore.admin.provisioning import KubernetesProvisioner, LocalProvisionerHook, Provisioner
from recstore.admin.security import hash_token
from recstore.admin.settings import Settings
from recstore.core.errors import RecStoreError

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
STATIC_DIR = Path(__file__).parent / "static"


def _default_provisioner(settings: Settings) -> Provisioner:
    if settings.kubernetes:
        return KubernetesProvisioner.in_cluster(settings.kubernetes_namespace)
    return LocalProvisionerHook()


def create_app(
    settings: Settings | None = None, *, provisioner: Provisioner | None = None
) -> FastAPI:
    settings = settings or Settings()
    engine = db.make_engine(settings.database_url)
    if settings.migrate_on_start:
        db.upgrade(engine)
    bootstrap = settings.resolved_bootstrap_token()
    context = AppContext(
        settings=settings,
        engine=engine,
        sessions=db.make_sessionmaker(engine),
        provisioner=provisioner or _default_provisioner(settings),
        bootstrap_hash=hash_token(bootstrap) if bootstrap else None,
    )
    log.info(
        "admin API on %s (bootstrap token %s, provisioner %s)",
        engine.url.render_as_string(hide_password=True),
        "configured" if bootstrap else "not configured",
        type(context.provisioner).__name__,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="RecStore admin API",
        version=__version__,
        description="Catalogue of embedding tables, PS nodes, checkpoints, tokens, audit events.",
        lifespan=lifespan,
    )
    app.state.context = context
    install_metrics(app, context.registry, context.sessions)
    _reject_nul_bytes(app)
    _install_error_handlers(app)
    # added last, so it runs first: no body over the cap is read, not even to authenticate
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_body_bytes)

    for module in (tables, pools, checkpoints, nodes, events, tokens):
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    return app


def _reject_nul_bytes(app: FastAPI) -> None:
    """NUL cannot be stored or compared in PostgreSQL text: refuse it in paths and queries."""

    @app.middleware("http")
    async def reject_nul(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        raw = request.scope.get("query_string", b"").lower()
        if "\x00" in request.url.path or b"%00" in raw or b"\x00" in raw:
            return JSONResponse({"detail": "NUL characters are not allowed in the URL"}, 422)
        return await call_next(request)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(dashboard.LoginRequired)
    async def login_required(request: Request, _: Exception) -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)

    @app.exception_handler(RecStoreError)
    async def recstore_error(_: Request, exc: RecStoreError) -> JSONResponse:
        status = http_status_of(exc)
        headers = {"Retry-After": "5"} if status == 503 else None
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    @app.exception_handler(ValidationError)
    async def invalid_result(_: Request, exc: ValidationError) -> JSONResponse:
        # A patch whose merged spec fails validation: the same shape FastAPI gives a bad body.
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)
