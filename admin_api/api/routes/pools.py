"""Pools: create / list / get / patch / delete, and the provisioner's status reports.

An EmbeddingPool is the fleet many tables share; tables name it (``pool`` on create). Reads
need the viewer role, changes the editor role, status reports the provisioner identity, as
for tables.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status
from sqlalchemy.orm import Session

from recstore.admin import crud, views
from recstore.admin.api.deps import (
    EditorDep,
    ProvisionerDep,
    ProvisionerRoleDep,
    SessionDep,
    ViewerDep,
    expected_version,
    parse_version,
)
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.models import PoolRecord
from recstore.admin.schemas import Page, PoolCreate, PoolPatch, PoolPublic
from recstore.core.pool import PoolStatus

router = APIRouter(
    prefix="/pools",
    route_class=StrictJsonRoute,
    tags=["pools"],
    responses={
        404: {"description": "no pool of that name"},
        409: {
            "description": "the name exists, the resourceVersion is stale, the pool holds "
            "tables, or the provisioner cannot apply the change"
        },
        502: {"description": "the provisioner refused the change; nothing was written"},
    },
)

IfMatch = Annotated[str | None, Header(description="resourceVersion the change is based on")]
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]


def _public(session: Session, pool: PoolRecord, response: Response | None = None) -> PoolPublic:
    public = views.pool_public(pool, [t.name for t in crud.tables_on(session, name=pool.name)])
    if response is not None:
        response.headers["ETag"] = f'"{public.resource_version}"'
    return public


@router.post("", status_code=status.HTTP_201_CREATED, response_model=PoolPublic)
def create_pool(
    body: PoolCreate,
    response: Response,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
) -> PoolPublic:
    """The pool's nodes start; the tables that waited for it are placed on them."""
    spec = body.pool_spec()
    pool = crud.create_pool(session, name=body.name, spec=spec, actor=principal.actor)
    provisioner.create_pool(body.name, spec)  # raises (and nothing is committed) if refused
    crud.commit(session)
    response.headers["Location"] = f"/api/v1/pools/{pool.name}"
    return _public(session, pool, response)


@router.get("", response_model=Page[PoolPublic])
def list_pools(
    session: SessionDep, _: ViewerDep, limit: Limit = 50, offset: Offset = 0
) -> Page[PoolPublic]:
    items, total = crud.list_pools(session, limit=limit, offset=offset)
    return Page(items=[_public(session, p) for p in items], total=total, limit=limit, offset=offset)


@router.get("/{name}", response_model=PoolPublic)
def get_pool(name: str, response: Response, session: SessionDep, _: ViewerDep) -> PoolPublic:
    return _public(session, crud.get_pool(session, name=name), response)


@router.patch("/{name}", response_model=PoolPublic)
def patch_pool(
    name: str,
    body: PoolPatch,
    response: Response,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
    if_match: IfMatch = None,
) -> PoolPublic:
    """Change part of a pool's spec; a stale ``If-Match``/``resourceVersion`` answers 409,
    and so does a change the provisioner cannot apply to running nodes (nothing written)."""
    expected = expected_version(if_match, body.resource_version)
    pool, previous = crud.against_newest(
        session,
        expected,
        lambda: crud.patch_pool(
            session,
            pool=crud.get_pool(session, name=name),
            changes=body.spec_changes(),
            expected_version=expected,
            actor=principal.actor,
        ),
    )
    if previous is not None:
        provisioner.update_pool(name, views.pool_spec_of(pool), previous=previous)
        crud.commit(session)
    return _public(session, pool, response)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_pool(
    name: str,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
    if_match: IfMatch = None,
) -> None:
    """The pool's nodes stop; refused (409, naming them) while tables are placed on it."""
    expected = parse_version(if_match, "If-Match")
    crud.against_newest(
        session,
        expected,
        lambda: crud.delete_pool(
            session, pool=crud.get_pool(session, name=name), expected_version=expected,
            actor=principal.actor,
        ),
    )  # fmt: skip
    provisioner.delete_pool(name)
    crud.commit(session)


@router.put(
    "/{name}/status",
    response_model=PoolPublic,
    responses={403: {"description": "the token is not the provisioner's"}},
)
def put_pool_status(
    name: str, body: PoolStatus, response: Response, session: SessionDep,
    principal: ProvisionerRoleDep,
) -> PoolPublic:  # fmt: skip
    """Written by the provisioner identity only (the operator or the local provisioner)."""
    pool = crud.set_pool_status(
        session, pool=crud.get_pool(session, name=name), status=body, actor=principal.actor
    )
    crud.commit(session)
    return _public(session, pool, response)
