"""Tables: create / list / get / patch / delete, operator status, online-move events, an
operator's recovery of a refused table, SDK discovery."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from recstore.admin import crud, views
from recstore.admin.api.deps import (
    ContextDep,
    EditorDep,
    ProvisionerDep,
    ProvisionerRoleDep,
    SessionDep,
    ViewerDep,
    expected_version,
    parse_version,
)
from recstore.admin.cache_view import cache_view, scrape_table
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.schemas import (
    Discovery,
    EventPublic,
    Page,
    TableCachePublic,
    TableCreate,
    TablePatch,
    TablePublic,
    TableRecoveryReport,
)
from recstore.core.reshard.events import ReshardEvent
from recstore.core.status import TableStatus

router = APIRouter(
    prefix="/tables",
    route_class=StrictJsonRoute,
    tags=["tables"],
    responses={
        404: {"description": "no table of that name"},
        409: {"description": "the name exists, or the resourceVersion is stale"},
        502: {"description": "the provisioner refused the change; nothing was written"},
    },
)

IfMatch = Annotated[str | None, Header(description="resourceVersion the change is based on")]
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]


def _etag(response: Response, public: TablePublic) -> TablePublic:
    response.headers["ETag"] = f'"{public.resource_version}"'
    return public


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TablePublic)
def create_table(
    body: TableCreate,
    response: Response,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
) -> TablePublic:
    """A table of its own fleet, or (``pool``) one its pool's nodes hold: Pending with
    condition Pool until the pool exists."""
    spec = body.table_spec()
    if body.pool is not None:
        spec = crud.placed_spec(session, pool=body.pool, spec=spec, declared=body.model_fields_set)
    table = crud.create_table(session, spec=spec, actor=principal.actor, pool=body.pool)
    provisioner.create_table(spec, pool=body.pool)  # raises (nothing committed) if refused
    crud.commit(session)
    response.headers["Location"] = f"/api/v1/tables/{table.name}"
    return _etag(response, views.table_public(table))


@router.get("", response_model=Page[TablePublic])
def list_tables(
    session: SessionDep,
    _: ViewerDep,
    phase: Annotated[str | None, Query(max_length=32)] = None,
    name_prefix: Annotated[str | None, Query(max_length=63)] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> Page[TablePublic]:
    items, total = crud.list_tables(
        session, phase=phase, name_prefix=name_prefix, limit=limit, offset=offset
    )
    return Page(
        items=[views.table_public(t) for t in items], total=total, limit=limit, offset=offset
    )


@router.get("/{name}", response_model=TablePublic)
def get_table(name: str, response: Response, session: SessionDep, _: ViewerDep) -> TablePublic:
    return _etag(response, views.table_public(crud.get_table(session, name=name)))


@router.get("/{name}/cache", response_model=TableCachePublic)
async def table_cache(name: str, context: ContextDep, _: ViewerDep) -> TableCachePublic:
    """The table's caches read live from its nodes: the engine's GPU cache per shard and
    in total, and the host caches clients reported (each once, newest report)."""
    shards, samples = await scrape_table(context, name)
    return TableCachePublic.model_validate(cache_view(shards, samples))


@router.patch("/{name}", response_model=TablePublic)
def patch_table(
    name: str,
    body: TablePatch,
    response: Response,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
    if_match: IfMatch = None,
) -> TablePublic:
    """Change part of a table's spec; a stale ``If-Match``/``resourceVersion`` answers 409.

    A new shard count is recorded (``reshard_required``) but moves no data by itself.
    """
    expected = expected_version(if_match, body.resource_version)
    table, previous = crud.against_newest(
        session,
        expected,
        lambda: crud.patch_table(
            session,
            table=crud.get_table(session, name=name),
            changes=body.spec_changes(),
            expected_version=expected,
            actor=principal.actor,
        ),
    )
    if previous is not None:
        provisioner.update_table(views.spec_of(table), previous=previous, pool=table.pool)
        crud.commit(session)
    return _etag(response, views.table_public(table))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_table(
    name: str,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
    if_match: IfMatch = None,
) -> None:
    expected = parse_version(if_match, "If-Match")
    crud.against_newest(
        session,
        expected,
        lambda: crud.delete_table(
            session,
            table=crud.get_table(session, name=name),
            expected_version=expected,
            actor=principal.actor,
        ),
    )
    provisioner.delete_table(name)
    crud.commit(session)


@router.put(
    "/{name}/status",
    response_model=TablePublic,
    responses={
        403: {"description": "the token is not the provisioner's"},
        422: {"description": "a shard endpoint is not the one its registered node serves"},
    },
)
def put_status(
    name: str,
    body: TableStatus,
    response: Response,
    session: SessionDep,
    principal: ProvisionerRoleDep,
) -> TablePublic:
    """Written by the provisioner identity only (the operator or the local provisioner).

    Each shard endpoint must be the one the provisioner registered for that
    shard (``POST /nodes``): discovery sends trainers, and their tokens, there.
    """
    table = crud.set_status(
        session, table=crud.get_table(session, name=name), status=body, actor=principal.actor
    )
    crud.forget_removed_nodes(session, table=table, actor=principal.actor)
    crud.commit(session)
    return _etag(response, views.table_public(table))


@router.post(
    "/{name}/resharding-events",
    status_code=status.HTTP_201_CREATED,
    response_model=EventPublic,
    responses={403: {"description": "the token is not the provisioner's"}},
)
def post_resharding_event(
    name: str, body: ReshardEvent, session: SessionDep, principal: ProvisionerRoleDep
) -> EventPublic:
    """A moment of the table's online move (started, a batch committed, finished, aborted,
    resumed, a change queued), written by the provisioner identity to the audit log as
    ``reshard.<moment>``."""
    event = crud.record_reshard(
        session, table=crud.get_table(session, name=name), event=body, actor=principal.actor
    )
    crud.commit(session)
    return EventPublic.model_validate(event)


@router.post(
    "/{name}/recoveries",
    status_code=status.HTTP_201_CREATED,
    response_model=EventPublic,
    responses={422: {"description": "the report is not of this table"}},
)
def post_recovery(
    name: str, body: TableRecoveryReport, session: SessionDep, principal: EditorDep
) -> EventPublic:
    """An operator's recovery of a table its nodes refused (``recstore recover``), with
    what each node reported (a log loss accepted: exactly what it dropped), written to
    the audit log as ``table.recover``."""
    event = crud.record_recovery(
        session, table=crud.get_table(session, name=name), report=body, actor=principal.actor
    )
    crud.commit(session)
    return EventPublic.model_validate(event)


@router.get(
    "/{name}/discovery",
    response_model=Discovery,
    responses={503: {"description": "some shard has no endpoint yet (Retry-After is set)"}},
)
def discovery(name: str, session: SessionDep, _: ViewerDep) -> Discovery:
    """Shape and shard endpoints (in shard order) for the SDK; 503 until every shard has one."""
    return views.discovery(crud.get_table(session, name=name))
