"""Writing the audit log: the one place that gives an event record its shape.

Every mutation adds its event in its own transaction, so a change that is
refused or rolled back leaves no event either. An action reads
``<resource type>.<verb>`` (``table.update``, ``node.ready``), which is where an
event's resource type comes from.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from recstore.admin.models import EventRecord


def record(
    session: Session,
    actor: str,
    action: str,
    *,
    table: str | None = None,
    resource: str | int | None = None,
    before: Any = None,
    after: Any = None,
) -> EventRecord:
    """Add the event of ``action`` on a table, on a part of one, or on something outside tables.

    ``table`` alone names a table's own event; ``table`` with ``resource`` (a
    node's shard index, a checkpoint's id) names ``<table>/<resource>``;
    ``resource`` alone (a token's name) belongs to no table.
    """
    resource_type, _, verb = action.partition(".")
    if not resource_type or not verb:
        raise ValueError(f"audit action {action!r} is not '<resource type>.<verb>'")
    if table is None and resource is None:
        raise ValueError(f"audit event {action!r} names neither a table nor a resource")
    if table is None:
        resource_name = str(resource)
    else:
        resource_name = table if resource is None else f"{table}/{resource}"
    event = EventRecord(
        actor=actor,
        action=action,
        resource_type=resource_type,
        resource_name=resource_name,
        table_name=table,
        before=before,
        after=after,
    )
    session.add(event)
    return event
