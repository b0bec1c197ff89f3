"""Checkpoint operations behind ``routes/checkpoints.py``: request, list, settle from status."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin.crud import audit
from recstore.admin.crud.paging import page
from recstore.admin.crud.writes import writes
from recstore.admin.models import CheckpointRecord, TableRecord, utcnow
from recstore.core.checkpoint_status import (
    FINISHED,
    CheckpointState,
    TableCheckpoint,
    requested_checkpoint_id,
)


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
    return page(session, query, limit=limit, offset=offset)


def request_checkpoint(
    session: Session, *, table: TableRecord, note: str | None, actor: str
) -> CheckpointRecord:
    record = CheckpointRecord(
        table=table,
        state=CheckpointState.requested.value,
        requested_by=actor,
        detail={"note": note} if note else None,
    )
    with writes(session):
        session.add(record)
    audit.record(
        session,
        actor,
        "checkpoint.request",
        table=table.name,
        resource=record.id,
        after={"id": record.id, "state": record.state, "note": note},
    )
    return record


def recent_checkpoints(session: Session, *, limit: int) -> list[CheckpointRecord]:
    """The latest checkpoints of every table, newest first."""
    query = select(CheckpointRecord).order_by(CheckpointRecord.id.desc()).limit(limit)
    return list(session.scalars(query))


def settle_checkpoint_requests(
    session: Session, *, table: TableRecord, reported: TableCheckpoint | None
) -> None:
    """A reported ``checkpointRequest`` moves the record it names to its state: Running,
    or Completed / Failed with the outcome in ``detail.result`` (every shard's part; a
    failure's reason in its ``message``). Older records of the table still Requested were
    never taken (a provisioner takes one at a time, in order): they fail, saying so."""
    if reported is None or reported.request_id is None:
        return
    record = session.get(CheckpointRecord, reported.request_id)
    if record is None or record.table_id != table.id:
        return
    if record.state not in _FINISHED and reported.state != CheckpointState.requested:
        record.state = CheckpointState(reported.state).value
        if reported.finished:
            record.completed_at = utcnow()
            record.detail = {**(record.detail or {}), "result": reported.to_wire()}
    lost = select(CheckpointRecord).where(
        CheckpointRecord.table_id == table.id,
        CheckpointRecord.id < record.id,
        CheckpointRecord.state == CheckpointState.requested.value,
    )
    for older in session.scalars(lost):
        never = TableCheckpoint(
            id=requested_checkpoint_id(older.id),
            request_id=older.id,
            state=CheckpointState.failed,
            message=f"never taken: the provisioner took checkpoint {record.id}, asked after it",
        )
        older.state = never.state
        older.completed_at = utcnow()
        older.detail = {**(older.detail or {}), "result": never.to_wire()}


_FINISHED = {state.value for state in FINISHED}
