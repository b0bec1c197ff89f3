"""Catalogue operations: keyword-only functions over a Session, each writing its audit event.

Functions flush but do not commit: the route commits once the provisioner has
accepted the change, so a refused change leaves nothing behind. A write that
lost a race with another one fails at flush with VersionConflict.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from recstore.admin import views
from recstore.admin.errors import NotFound, VersionConflict
from recstore.admin.models import (
    CheckpointRecord,
    EventRecord,
    NodeRecord,
    TableRecord,
    TokenRecord,
    utcnow,
)
from recstore.admin.schemas import NodeHeartbeat, NodeRegister, TableStatus
from recstore.admin.security import Role, display_prefix, generate_token, hash_token
from recstore.admin.spec_patch import apply_patch
from recstore.core import SlotMap, TableSpec
from recstore.core.errors import InvalidArgument, TableExists, TableNotFound

#: How stale a token's last_used_at may get before a request refreshes it.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@contextmanager
def _writes(session: Session, *, on_duplicate: Exception | None = None) -> Iterator[None]:
    """Flush, turning a lost race into VersionConflict (or ``on_duplicate`` for a unique key)."""
    try:
        yield
        session.flush()
    except StaleDataError as exc:
        session.rollback()
        raise VersionConflict("the resource was changed concurrently; read it again") from exc
    except IntegrityError as exc:
        session.rollback()
        raise (on_duplicate or VersionConflict(f"conflicting write: {exc.orig}")) from exc


def commit(session: Session) -> None:
    with _writes(session):
        session.commit()


def record_event(
    session: Session,
    *,
    actor: str,
    action: str,
    resource_type: str,
    resource_name: str,
    table_name: str | None = None,
    before: Any = None,
    after: Any = None,
) -> EventRecord:
    event = EventRecord(
        actor=actor,
        action=action,
        resource_type=resource_type,
        resource_name=resource_name,
        table_name=table_name,
        before=before,
        after=after,
    )
    session.add(event)
    return event


def _page(
    session: Session, query: Select[Any], *, limit: int, offset: int
) -> tuple[list[Any], int]:
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    return list(session.scalars(query.limit(limit).offset(offset))), total


# --- tables ---------------------------------------------------------------------


def get_table(session: Session, *, name: str) -> TableRecord:
    table = session.scalar(select(TableRecord).where(TableRecord.name == name))
    if table is None:
        raise TableNotFound(f"table {name!r} not found")
    return table


def list_tables(
    session: Session, *, phase: str | None, name_prefix: str | None, limit: int, offset: int
) -> tuple[list[TableRecord], int]:
    query = select(TableRecord).order_by(TableRecord.name)
    if phase:
        query = query.where(TableRecord.phase == phase)
    if name_prefix:
        query = query.where(TableRecord.name.startswith(name_prefix, autoescape=True))
    return _page(session, query, limit=limit, offset=offset)


def create_table(session: Session, *, spec: TableSpec, actor: str) -> TableRecord:
    if session.scalar(select(TableRecord.id).where(TableRecord.name == spec.name)) is not None:
        raise TableExists(f"table {spec.name!r} already exists")
    table = TableRecord(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        generation=1,
        phase="Pending",
        conditions=[],
        status_shards=[],
        slot_map=SlotMap.initial(spec.shards).to_dict(),
        created_by=actor,
    )
    with _writes(session, on_duplicate=TableExists(f"table {spec.name!r} already exists")):
        session.add(table)
    record_event(
        session,
        actor=actor,
        action="table.create",
        resource_type="table",
        resource_name=spec.name,
        table_name=spec.name,
        after=views.table_snapshot(table),
    )
    return table


def check_version(table: TableRecord, expected: int | None) -> None:
    if expected is not None and expected != table.resource_version:
        raise VersionConflict(
            f"table {table.name!r} is at resourceVersion {table.resource_version}, "
            f"the request was made against {expected}; read it again"
        )


def patch_table(
    session: Session,
    *,
    table: TableRecord,
    changes: dict[str, Any],
    expected_version: int | None,
    actor: str,
) -> tuple[TableRecord, TableSpec | None]:
    """Apply a partial spec; returns the table and the previous spec (None: nothing changed)."""
    check_version(table, expected_version)
    previous = views.spec_of(table)
    updated = apply_patch(previous, changes)
    if updated == previous:
        return table, None
    before = views.table_snapshot(table)
    with _writes(session):
        table.spec = updated.model_dump(mode="json")
        table.generation += 1
    after = views.table_snapshot(table)
    if views.reshard_required(table):
        after["reshardRequired"] = {
            "from": views.slot_map_of(table).num_shards,
            "to": updated.shards,
        }
    record_event(
        session,
        actor=actor,
        action="table.update",
        resource_type="table",
        resource_name=table.name,
        table_name=table.name,
        before=before,
        after=after,
    )
    return table, previous


def delete_table(
    session: Session, *, table: TableRecord, expected_version: int | None, actor: str
) -> None:
    check_version(table, expected_version)
    before = views.table_snapshot(table)
    with _writes(session):
        session.delete(table)
    record_event(
        session,
        actor=actor,
        action="table.delete",
        resource_type="table",
        resource_name=table.name,
        table_name=table.name,
        before=before,
    )


def set_status(
    session: Session, *, table: TableRecord, status: TableStatus, actor: str
) -> TableRecord:
    shards = views.slot_map_of(table).num_shards
    if status.slot_map is not None:
        try:
            slot_map = SlotMap.from_dict(status.slot_map.model_dump())
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"slotMap: {exc}") from exc
        shards = slot_map.num_shards
    wide = max(shards, int(table.spec["shards"]))
    for shard in status.shards:
        if shard.index >= wide:
            raise InvalidArgument(f"shards[].index {shard.index} is out of range 0..{wide - 1}")
    before = views.table_snapshot(table)
    with _writes(session):
        table.phase = status.phase
        table.conditions = [
            c.model_dump(by_alias=True, exclude_none=True) for c in status.conditions
        ]
        table.observed_generation = status.observed_generation
        table.status_shards = [s.model_dump() for s in sorted(status.shards, key=lambda s: s.index)]
        if status.slot_map is not None:
            table.slot_map = slot_map.to_dict()
        elif status.slot_map_epoch is not None:
            table.slot_map = {**table.slot_map, "epoch": status.slot_map_epoch}
        table.last_checkpoint = status.last_checkpoint
        _complete_checkpoint(session, table=table, last=status.last_checkpoint)
    after = views.table_snapshot(table)
    if after != before:
        record_event(
            session,
            actor=actor,
            action="table.status",
            resource_type="table",
            resource_name=table.name,
            table_name=table.name,
            before=before,
            after=after,
        )
    return table


def _complete_checkpoint(session: Session, *, table: TableRecord, last: Any) -> None:
    """A reported lastCheckpoint naming a requested checkpoint's id completes it."""
    if not isinstance(last, dict):
        return
    ident = last.get("requestId", last.get("id"))
    if not isinstance(ident, int) or not 0 < ident < 2**31:
        return
    record = session.get(CheckpointRecord, ident)
    if record is not None and record.table_id == table.id and record.state == "Requested":
        record.state = "Completed"
        record.completed_at = utcnow()
        record.detail = {**(record.detail or {}), "result": last}


# --- nodes ------------------------------------------------------------------------


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
    return _page(session, query, limit=limit, offset=offset)


def register_node(session: Session, *, body: NodeRegister, actor: str) -> tuple[NodeRecord, bool]:
    """Register (or re-register) the node of one shard; returns (node, created)."""
    table = get_table(session, name=body.table)
    wide = max(int(table.spec["shards"]), views.slot_map_of(table).num_shards)
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
    with _writes(session):
        if node is None:
            node = NodeRecord(table=table, shard_index=body.shard_index, rows=0, memory_bytes=0)
            session.add(node)
        node.endpoint = body.endpoint
        node.metrics_endpoint = body.metrics_endpoint
        node.ready = False
        node.registered_at = utcnow()
    record_event(
        session,
        actor=actor,
        action="node.register",
        resource_type="node",
        resource_name=f"{table.name}/{body.shard_index}",
        table_name=table.name,
        before=before,
        after=views.node_snapshot(node),
    )
    return node, created


def heartbeat(session: Session, *, node: NodeRecord, body: NodeHeartbeat, actor: str) -> NodeRecord:
    """Record liveness and sizes; only a change of readiness is an audit event (not every beat)."""
    was_ready = node.ready
    with _writes(session):
        node.ready = body.ready
        node.rows = body.rows
        node.memory_bytes = body.memory_bytes
        node.last_heartbeat = utcnow()
    if was_ready != body.ready:
        record_event(
            session,
            actor=actor,
            action="node.ready" if body.ready else "node.unready",
            resource_type="node",
            resource_name=f"{node.table.name}/{node.shard_index}",
            table_name=node.table.name,
            before={"ready": was_ready},
            after={"ready": body.ready},
        )
    return node


def delete_node(session: Session, *, node: NodeRecord, actor: str) -> None:
    name, table_name = f"{node.table.name}/{node.shard_index}", node.table.name
    before = views.node_snapshot(node)
    with _writes(session):
        session.delete(node)
    record_event(
        session,
        actor=actor,
        action="node.delete",
        resource_type="node",
        resource_name=name,
        table_name=table_name,
        before=before,
    )


# --- checkpoints ------------------------------------------------------------------


def list_checkpoints(
    session: Session, *, table: TableRecord, state: str | None, limit: int, offset: int
) -> tuple[list[CheckpointRecord], int]:
    query = (
        select(CheckpointRecord)
        .where(CheckpointRecord.table_id == table.id)
        .order_by(CheckpointRecord.id.desc())
    )
    if state:
        query = query.where(CheckpointRecord.state == state)
    return _page(session, query, limit=limit, offset=offset)


def request_checkpoint(
    session: Session, *, table: TableRecord, note: str | None, actor: str
) -> CheckpointRecord:
    record = CheckpointRecord(
        table=table, state="Requested", requested_by=actor, detail={"note": note} if note else None
    )
    with _writes(session):
        session.add(record)
    record_event(
        session,
        actor=actor,
        action="checkpoint.request",
        resource_type="checkpoint",
        resource_name=f"{table.name}/{record.id}",
        table_name=table.name,
        after={"id": record.id, "state": record.state, "note": note},
    )
    return record


# --- events -----------------------------------------------------------------------


def list_events(
    session: Session,
    *,
    table: str | None,
    actor: str | None,
    action: str | None,
    limit: int,
    offset: int,
) -> tuple[list[EventRecord], int]:
    query = select(EventRecord).order_by(EventRecord.id.desc())
    if table:
        query = query.where(EventRecord.table_name == table)
    if actor:
        query = query.where(EventRecord.actor == actor)
    if action:
        query = query.where(EventRecord.action == action)
    return _page(session, query, limit=limit, offset=offset)


# --- tokens -----------------------------------------------------------------------


def create_token(session: Session, *, name: str, role: Role, actor: str) -> tuple[TokenRecord, str]:
    """A new token and its secret (the secret is not stored and cannot be shown again)."""
    secret = generate_token()
    token = TokenRecord(
        name=name,
        role=role.value,
        token_hash=hash_token(secret),
        prefix=display_prefix(secret),
        created_by=actor,
    )
    with _writes(session):
        session.add(token)
    record_event(
        session,
        actor=actor,
        action="token.create",
        resource_type="token",
        resource_name=name,
        after=views.token_snapshot(token),
    )
    return token, secret


def list_tokens(
    session: Session, *, include_revoked: bool, limit: int, offset: int
) -> tuple[list[TokenRecord], int]:
    query = select(TokenRecord).order_by(TokenRecord.id)
    if not include_revoked:
        query = query.where(TokenRecord.revoked_at.is_(None))
    return _page(session, query, limit=limit, offset=offset)


def revoke_token(session: Session, *, token_id: int, actor: str) -> TokenRecord:
    token = session.get(TokenRecord, token_id)
    if token is None:
        raise NotFound(f"token {token_id} not found")
    if token.revoked_at is not None:
        return token
    before = views.token_snapshot(token)
    with _writes(session):
        token.revoked_at = utcnow()
    record_event(
        session,
        actor=actor,
        action="token.revoke",
        resource_type="token",
        resource_name=token.name,
        before=before,
        after=views.token_snapshot(token),
    )
    return token


def active_token(session: Session, *, secret: str) -> TokenRecord | None:
    """The unrevoked token whose hash matches ``secret``; refreshes its last use."""
    token = session.scalar(select(TokenRecord).where(TokenRecord.token_hash == hash_token(secret)))
    if token is None or token.revoked_at is not None:
        return None
    now = utcnow()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        token.last_used_at = now
        session.commit()
    return token


def recent_checkpoints(session: Session, *, limit: int) -> list[CheckpointRecord]:
    """The latest checkpoints of every table, newest first."""
    query = select(CheckpointRecord).order_by(CheckpointRecord.id.desc()).limit(limit)
    return list(session.scalars(query))
