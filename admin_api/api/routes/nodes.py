"""PS nodes: registration, heartbeat (readiness and sizes), listing, removal.

Registration and heartbeats come from the provisioner identity only: a node's
endpoint becomes a discovery address and its metrics URL is fetched by the
dashboard, so no human token may set either. Removing a node takes admin.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from recstore.admin import crud, views
from recstore.admin.api.deps import AdminDep, ProvisionerRoleDep, SessionDep, ViewerDep
from recstore.admin.json_body import StrictJsonRoute
from recstore.admin.schemas import NodeHeartbeat, NodePublic, NodeRegister, Page

router = APIRouter(prefix="/nodes", tags=["nodes"], route_class=StrictJsonRoute)

NodeId = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=NodePublic)
def register_node(
    body: NodeRegister, response: Response, session: SessionDep, principal: ProvisionerRoleDep
) -> NodePublic:
    """Register the node serving one shard; re-registering the same shard answers 200."""
    node, created = crud.register_node(
        session, body=body, actor=principal.actor, role=principal.role
    )
    crud.commit(session)
    if not created:
        response.status_code = status.HTTP_200_OK
    return views.node_public(node)


@router.get("", response_model=Page[NodePublic])
def list_nodes(
    session: SessionDep,
    _: ViewerDep,
    table: Annotated[str | None, Query(max_length=63)] = None,
    ready: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[NodePublic]:
    items, total = crud.list_nodes(session, table=table, ready=ready, limit=limit, offset=offset)
    return Page(
        items=[views.node_public(n) for n in items], total=total, limit=limit, offset=offset
    )


@router.get("/{node_id}", response_model=NodePublic)
def get_node(node_id: NodeId, session: SessionDep, _: ViewerDep) -> NodePublic:
    return views.node_public(crud.get_node(session, node_id=node_id))


@router.post("/{node_id}/heartbeat", response_model=NodePublic)
def heartbeat(
    node_id: NodeId, body: NodeHeartbeat, session: SessionDep, principal: ProvisionerRoleDep
) -> NodePublic:
    node = crud.heartbeat(
        session, node=crud.get_node(session, node_id=node_id), body=body, actor=principal.actor
    )
    crud.commit(session)
    return views.node_public(node)


@router.delete("/{node_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_node(node_id: NodeId, session: SessionDep, principal: AdminDep) -> None:
    crud.delete_node(session, node=crud.get_node(session, node_id=node_id), actor=principal.actor)
    crud.commit(session)
