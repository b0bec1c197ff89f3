"""The audit log: who changed what, when, with the state before and after."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from recstore.admin import crud
from recstore.admin.api.deps import SessionDep, ViewerDep
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.schemas import EventPublic, Page

router = APIRouter(prefix="/events", tags=["events"], route_class=StrictJsonRoute)


@router.get("", response_model=Page[EventPublic])
def list_events(
    session: SessionDep,
    _: ViewerDep,
    table: Annotated[str | None, Query(max_length=63)] = None,
    actor: Annotated[str | None, Query(max_length=255)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[EventPublic]:
    """Newest first."""
    items, total = crud.list_events(
        session, table=table, actor=actor, action=action, limit=limit, offset=offset
    )
    return Page(
        items=[EventPublic.model_validate(e) for e in items],
        total=total,
        limit=limit,
        offset=offset,
    )
