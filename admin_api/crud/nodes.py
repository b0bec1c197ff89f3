"""PS node operations behind ``routes/nodes.py``: registration, heartbeat, listing, removal."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin import views
from recstore.admin.crud import audit
from recstore.admin.crud.paging import page
from recstore.admin.crud.tables import get_table
from recstore.admin.crud.writes import writes
from recstore.admin.errors import NotFound
from recstore.admin.models import NodeRecord, TableRecord, utcnow
from recstore.admin.schemas import NodeHeartbeat, NodeRegister
from recstore.admin.security import Role
from recstore.core.errors import InvalidArgument


def get_node(session: Session, *, node_id: int) -> NodeRecord:
    node = session.get(NodeRecord, node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    return node


def list_nodes(
    session: Session, *, table: str | None, ready: bool | None, limit: int, offset: int
) -> tuple[list[NodeRecord], int]:
    query = select(NodeRecord).join(TableRecord).order_by(TableRecord.name, NodeRecord.shard_index)
    if table:
        query = query.where(TableRecord.name == table)
    if ready is not None:
        query = query.where(NodeRecord.ready == ready)
    return page(session, query, limit=limit, offset=offset)


def register_node(
    session: Session, *, body: NodeRegister, actor: str, role: Role
) -> tuple[NodeRecord, bool]:
    """Register (or re-register) the node of one shard; returns (node, created).

    The registrar's role is kept with the node: only the provisioner's nodes
    are trusted as discovery endpoints and metrics sources.
    """
    table = get_table(session, name=body.table)
    wide = views.shard_width(table)
    if body.shard_index >= wide:
        raise InvalidArgument(
            f"shard_index {body.shard_index} is out of range for table {table.name!r} "
            f"with {wide} shard(s)"
        )
    node = session.scalar(
        select(NodeRecord).where(
            NodeRecord.table_id == table.id, NodeRecord.shard_index == body.shard_index
        )
    )
    created = node is None
    before = None if node is None else views.node_snapshot(node)
    with writes(session):
        if node is None:
            node = NodeRecord(table=table, shard_index=body.shard_index, rows=0, memory_bytes=0)
            session.add(node)
        node.endpoint = body.endpoint
        node.metrics_endpoint = body.metrics_endpoint
        node.ready = False
        node.registered_at = utcnow()
        node.registered_by = actor
        node.registered_role = role.value
    audit.record(
        session,
        actor,
        "node.register",
        table=table.name,
        resource=body.shard_index,
        before=before,
        after=views.node_snapshot(node),
    )
    return node, created


def heartbeat(session: Session, *, node: NodeRecord, body: NodeHeartbeat, actor: str) -> NodeRecord:
    """Record liveness and sizes; only a change of readiness is an audit event (not every beat)."""
    was_ready = node.ready
    with writes(session):
        node.ready = body.ready
        node.rows = body.rows
        node.memory_bytes = body.memory_bytes
        node.last_heartbeat = utcnow()
    if was_ready != body.ready:
        audit.record(
            session,
            actor,
            "node.ready" if body.ready else "node.unready",
            table=node.table.name,
            resource=node.shard_index,
            before={"ready": was_ready},
            after={"ready": body.ready},
        )
    return node


def delete_node(session: Session, *, node: NodeRecord, actor: str) -> None:
    table_name, shard_index = node.table.name, node.shard_index  # read before the row is gone
    before = views.node_snapshot(node)
    with writes(session):
        session.delete(node)
    audit.record(
        session, actor, "node.delete", table=table_name, resource=shard_index, before=before
    )


def forget_removed_nodes(session: Session, *, table: TableRecord, actor: str) -> None:
    """Delete the nodes of shards a shrink removed (neither the spec nor the slot map names
    them now): their last sizes would stay in the table's rows and memory, and the cache
    view would go on asking their gone endpoints. Run after each status report."""
    removed = [n for n in table.nodes if n.shard_index >= views.shard_width(table)]
    for node in removed:
        delete_node(session, node=node, actor=actor)
    if removed:
        session.expire(table, ["nodes"])  # the reply's sizes without them
