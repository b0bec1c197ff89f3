"""Server-rendered dashboard (Jinja2 + one small script): tables, pools, shards, charts,
checkpoints, events, and a token login that starts a server-side session
(see ``dashboard_auth``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from recstore.admin import crud, views
from recstore.admin.api.dashboard_auth import (
    CSRF_FIELD,
    SESSION_COOKIE,
    LoginRequired,
    UiFormPrincipal,
    UiPrincipal,
    check_same_origin,
)
from recstore.admin.api.deps import ContextDep, Principal, SessionDep, principal_for
from recstore.admin.cache_view import cache_view, scrape_table
from recstore.admin.crud.dashboard_sessions import SESSION_LIFETIME, end_session, start_session
from recstore.admin.errors import ProvisioningError
from recstore.admin.security import Role, hash_token
from recstore.core import TableSpec
from recstore.core.errors import RecStoreError

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parents[2] / "templates")

__all__ = ["LoginRequired", "router"]


def _render(
    request: Request, page: str, principal: Principal | None, status: int = 200, **values: Any
) -> HTMLResponse:
    can_edit = principal is not None and principal.role.allows(Role.editor)
    return templates.TemplateResponse(
        request,
        page,
        {
            "principal": principal,
            "can_edit": can_edit,
            "csrf_field": CSRF_FIELD,
            "csrf_token": getattr(request.state, "csrf_token", None),
            **values,
        },
        status_code=status,
    )


@router.get("/login")
def login_page(request: Request) -> HTMLResponse:
    return _render(request, "login.html", None)


@router.post("/login")
def login(
    request: Request, context: ContextDep, session: SessionDep, token: Annotated[str, Form()]
) -> Response:
    check_same_origin(request)  # a forged login would plant another user's session
    principal = principal_for(token.strip(), context, session) if token.strip() else None
    if principal is None:
        # The form is shown again with the reason (status 200: a browser logs any 4xx page load
        # as a console error, and the page itself is a normal answer to a form post).
        return _render(request, "login.html", None, error="That token is not valid.")
    _, secret = start_session(session, token_digest=hash_token(token.strip()))
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        httponly=True,
        samesite="strict",
        secure=context.settings.secure_cookies,
        max_age=int(SESSION_LIFETIME.total_seconds()),
    )
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, _: UiFormPrincipal) -> Response:
    """End the session on the server: the cookie no longer works, even if replayed."""
    end_session(session, secret=request.cookies[SESSION_COOKIE])
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/")
def tables_page(request: Request, session: SessionDep, principal: UiPrincipal) -> HTMLResponse:
    items, total = crud.list_tables(session, phase=None, name_prefix=None, limit=500, offset=0)
    return _render(
        request,
        "tables.html",
        principal,
        tables=[views.table_public(t) for t in items],
        total=total,
        form={},
        errors=[],
    )


def _spec_from_form(form: dict[str, str]) -> dict[str, Any]:
    return {
        "name": form.get("name", "").strip(),
        "num_embeddings": form.get("num_embeddings") or None,
        "embedding_dim": form.get("embedding_dim") or None,
        "dtype": form.get("dtype") or "float32",
        "shards": form.get("shards") or 1,
        "storage": form.get("storage") or "host",
        "optimizer": {"kind": form.get("optimizer") or "sgd", "lr": form.get("lr") or 0.01},
    }


@router.post("/tables")
async def create_table(
    request: Request, context: ContextDep, principal: UiFormPrincipal
) -> Response:
    form = {k: str(v) for k, v in (await request.form()).items()}
    errors: list[str] = []
    if not principal.role.allows(Role.editor):
        errors.append("Creating tables needs the editor role.")
    else:
        try:
            spec = TableSpec.model_validate(_spec_from_form(form))
            await run_in_threadpool(_create, context, spec, principal)
            return RedirectResponse(f"/ui/tables/{spec.name}", status_code=303)
        except ValidationError as exc:
            errors = [f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()]
        except (RecStoreError, ProvisioningError) as exc:
            errors = [str(exc)]

    def page() -> HTMLResponse:
        with context.sessions() as session:
            items, total = crud.list_tables(
                session, phase=None, name_prefix=None, limit=500, offset=0
            )
            return _render(
                request,
                "tables.html",
                principal,
                200,
                tables=[views.table_public(t) for t in items],
                total=total,
                form=form,
                errors=errors,
            )

    return await run_in_threadpool(page)


def _create(context: Any, spec: TableSpec, principal: Principal) -> None:
    with context.sessions() as session:
        crud.create_table(session, spec=spec, actor=principal.actor)
        context.provisioner.create_table(spec)
        crud.commit(session)


@router.get("/tables/{name}")
def table_page(
    request: Request, name: str, session: SessionDep, principal: UiPrincipal
) -> HTMLResponse:
    table = crud.get_table(session, name=name)
    checkpoints, _ = crud.list_checkpoints(session, table=table, state=None, limit=20, offset=0)
    return _render(
        request,
        "table.html",
        principal,
        table=views.table_public(table),
        nodes=[views.node_public(n) for n in table.nodes],
        endpoints=views.shard_endpoints(table, views.slot_map_of(table).num_shards),
        checkpoints=[views.checkpoint_public(c) for c in checkpoints],
    )


@router.post("/tables/{name}/checkpoints")
def trigger_checkpoint(
    name: str, context: ContextDep, session: SessionDep, principal: UiFormPrincipal
) -> Response:
    if not principal.role.allows(Role.editor):
        return Response("Requesting a checkpoint needs the editor role.", status_code=403)
    table = crud.get_table(session, name=name)
    record = crud.request_checkpoint(
        session, table=table, note="from the dashboard", actor=principal.actor
    )
    context.provisioner.request_checkpoint(table.name, record.id)
    crud.commit(session)
    return RedirectResponse(f"/ui/tables/{name}", status_code=303)


@router.get("/tables/{name}/metrics.json")
async def table_metrics(name: str, context: ContextDep, principal: UiPrincipal) -> JSONResponse:
    """One sample per shard: heartbeat sizes plus the node's scraped counters; the caches."""
    shards, samples = await scrape_table(context, name)
    cache = cache_view(shards, samples)
    for shard, sample in zip(shards, samples, strict=True):
        scraped = sample.to_dict()
        for key in ("rows", "memory_bytes"):  # prefer the live value over the last heartbeat
            if scraped[key] is None:
                scraped.pop(key)
        shard.update(scraped)
    return JSONResponse({"at": time.time(), "shards": shards, "cache": cache})


@router.get("/pools")
def pools_page(request: Request, session: SessionDep, principal: UiPrincipal) -> HTMLResponse:
    """The pools with their tables and the memory those reserve per node against the
    request."""
    items, total = crud.list_pools(session, limit=500, offset=0)
    pools = [
        views.pool_public(p, [t.name for t in crud.tables_on(session, name=p.name)]) for p in items
    ]
    return _render(request, "pools.html", principal, pools=pools, total=total)


@router.get("/checkpoints")
def checkpoints_page(request: Request, session: SessionDep, principal: UiPrincipal) -> HTMLResponse:
    records = crud.recent_checkpoints(session, limit=200)
    return _render(
        request,
        "checkpoints.html",
        principal,
        checkpoints=[views.checkpoint_public(c) for c in records],
    )


@router.get("/events")
def events_page(
    request: Request,
    session: SessionDep,
    principal: UiPrincipal,
    table: str | None = None,
    actor: str | None = None,
) -> HTMLResponse:
    items, total = crud.list_events(
        session, table=table or None, actor=actor or None, action=None, limit=200, offset=0
    )
    return _render(
        request,
        "events.html",
        principal,
        events=items,
        total=total,
        table=table or "",
        actor=actor or "",
    )
