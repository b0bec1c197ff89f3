"""Checkpoints of a table: the requested ones and their outcome; trigger a new one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, status

from recstore.admin import crud, views
from recstore.admin.api.deps import EditorDep, ProvisionerDep, SessionDep, ViewerDep
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.schemas import CheckpointCreate, CheckpointPublic, Page

router = APIRouter(
    prefix="/tables/{name}/checkpoints", tags=["checkpoints"], route_class=StrictJsonRoute
)


@router.get("", response_model=Page[CheckpointPublic])
def list_checkpoints(
    name: str,
    session: SessionDep,
    _: ViewerDep,
    state: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[CheckpointPublic]:
    table = crud.get_table(session, name=name)
    items, total = crud.list_checkpoints(
        session, table=table, state=state, limit=limit, offset=offset
    )
    return Page(
        items=[views.checkpoint_public(c) for c in items], total=total, limit=limit, offset=offset
    )


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=CheckpointPublic)
def request_checkpoint(
    name: str,
    session: SessionDep,
    provisioner: ProvisionerDep,
    principal: EditorDep,
    body: Annotated[CheckpointCreate | None, Body()] = None,
) -> CheckpointPublic:
    """Record a requested checkpoint and hand it to the provisioner (202: it runs later)."""
    table = crud.get_table(session, name=name)
    record = crud.request_checkpoint(
        session, table=table, note=body.note if body else None, actor=principal.actor
    )
    provisioner.request_checkpoint(table.name, record.id)
    crud.commit(session)
    return views.checkpoint_public(record)
