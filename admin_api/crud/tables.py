"""Table catalogue operations behind ``routes/tables.py``: create, read, patch, delete, status,
the moments of an online move, an operator's recovery of a refused table."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin import views
from recstore.admin.crud import audit
from recstore.admin.crud.checkpoints import settle_checkpoint_requests
from recstore.admin.crud.paging import page
from recstore.admin.crud.writes import writes
from recstore.admin.errors import VersionConflict
from recstore.admin.models import EventRecord, TableRecord
from recstore.admin.schemas import TableRecoveryReport
from recstore.admin.spec_patch import apply_patch
from recstore.core import SlotMap, TableSpec
from recstore.core.checkpoint_status import TableCheckpoint
from recstore.core.errors import InvalidArgument, TableExists, TableNotFound
from recstore.core.reshard.events import ReshardEvent
from recstore.core.status import TableStatus


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
    return page(session, query, limit=limit, offset=offset)


def create_table(
    session: Session, *, spec: TableSpec, actor: str, pool: str | None = None
) -> TableRecord:
    """Record the table; ``pool``: the EmbeddingPool whose nodes hold it (``spec`` then
    already has the pool's shards, when the pool exists)."""
    if session.scalar(select(TableRecord.id).where(TableRecord.name == spec.name)) is not None:
        raise TableExists(f"table {spec.name!r} already exists")
    table = TableRecord(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        pool=pool,
        generation=1,
        phase="Pending",
        conditions=[],
        status_shards=[],
        slot_map=SlotMap.initial(spec.shards).to_dict(),
        created_by=actor,
    )
    with writes(session, on_duplicate=TableExists(f"table {spec.name!r} already exists")):
        session.add(table)
    audit.record(session, actor, "table.create", table=spec.name, after=views.table_snapshot(table))
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
    if table.pool is not None:
        moved = [f for f in ("shards", "checkpoint") if getattr(updated, f) != getattr(previous, f)]
        if moved:
            raise InvalidArgument(
                f"{' and '.join(moved)}: table {table.name!r} runs on the nodes of pool "
                f"{table.pool!r}, whose {' and '.join(moved)} it takes; change the pool instead"
            )
    before = views.table_snapshot(table)
    with writes(session):
        table.spec = updated.model_dump(mode="json")
        table.generation += 1
    after = views.table_snapshot(table)
    if views.reshard_required(table):
        after["reshardRequired"] = {
            "from": views.slot_map_of(table).num_shards,
            "to": updated.shards,
        }
    audit.record(session, actor, "table.update", table=table.name, before=before, after=after)
    return table, previous


def delete_table(
    session: Session, *, table: TableRecord, expected_version: int | None, actor: str
) -> None:
    check_version(table, expected_version)
    before = views.table_snapshot(table)
    with writes(session):
        session.delete(table)
    audit.record(session, actor, "table.delete", table=table.name, before=before)


def check_endpoints_registered(table: TableRecord, status: TableStatus) -> None:
    """Every shard endpoint must be the one the provisioner registered for that shard.

    Discovery hands these addresses to trainers, which send their PS token
    there; an address no provisioned node has is refused (422), nothing written.
    """
    registered = views.provisioned_endpoints(table)
    for shard in status.shards:
        if shard.endpoint is None or registered.get(shard.index) == shard.endpoint:
            continue
        known = registered.get(shard.index)
        raise InvalidArgument(
            f"shards[{shard.index}].endpoint {shard.endpoint!r} is not a registered node of "
            f"table {table.name!r}: "
            + (
                f"shard {shard.index} is registered at {known!r}"
                if known
                else f"no node is registered for shard {shard.index}"
            )
            + " (the provisioner registers nodes with POST /api/v1/nodes first)"
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
    check_endpoints_registered(table, status)
    before = views.table_snapshot(table)
    with writes(session):
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
        table.last_checkpoint = _wire(status.last_checkpoint)
        table.checkpoint_request = _wire(status.checkpoint_request)
        settle_checkpoint_requests(session, table=table, reported=status.checkpoint_request)
    after = views.table_snapshot(table)
    if after != before:
        audit.record(session, actor, "table.status", table=table.name, before=before, after=after)
    return table


def _wire(checkpoint: TableCheckpoint | None) -> dict[str, Any] | None:
    return checkpoint.to_wire() if checkpoint is not None else None


def record_reshard(
    session: Session, *, table: TableRecord, event: ReshardEvent, actor: str
) -> EventRecord:
    """A moment of the table's online move (``recstore.core.reshard.events``), as its own
    audit event: ``reshard.<moment>`` with the event's payload as the state after."""
    return audit.record(session, actor, event.action, table=table.name, after=event.payload())


def record_recovery(
    session: Session, *, table: TableRecord, report: TableRecoveryReport, actor: str
) -> EventRecord:
    """An operator's recovery of a refused table (``recstore recover``), with what each
    node reported (a log loss accepted: exactly what it dropped), as ``table.recover``."""
    if report.table != table.name:
        raise InvalidArgument(f"the report is of table {report.table!r}, not {table.name!r}")
    after = report.model_dump(by_alias=True, mode="json")
    return audit.record(session, actor, "table.recover", table=table.name, after=after)
