"""Reading the audit log behind ``routes/events.py``; ``audit.py`` is what writes it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from recstore.admin.crud.paging import page
from recstore.admin.models import EventRecord


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
    return page(session, query, limit=limit, offset=offset)
