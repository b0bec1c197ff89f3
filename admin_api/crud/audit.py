"""Writing the audit log: the one place that gives an event record its shape.

Every mutation adds its event in its own transaction, so a change that is
refused or rolled back leaves no event either.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from recstore.admin.models import EventRecord


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
