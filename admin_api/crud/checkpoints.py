"""Checkpoint operations behind ``routes/checkpoints.py``: request, list, complete from status."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin.crud import audit
from recstore.admin.crud.paging import page
from recstore.admin.crud.writes import writes
from recstore.admin.models import CheckpointRecord, TableRecord, utcnow


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
        table=table, state="Requested", requested_by=actor, detail={"note": note} if note else None
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


def complete_reported_checkpoint(session: Session, *, table: TableRecord, last: Any) -> None:
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
